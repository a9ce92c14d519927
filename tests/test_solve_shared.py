"""What the searches of `nest plan` share through the problem's cache (nest.problem.problem's
with_mbs, the memory-aware bounds and compute_bounds of nest.solver.search, the interleaved
screens of nest.solver.interleaved_screen) changes nothing they return: the search on every
device (nest.interfaces.cli_run.all_devices_outcome) run after the default search equals the
same search on a fresh problem, and the brute force over the plans on every device."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from nest.interfaces.cli_run import all_devices_outcome
from nest.planners.registry import run_planner
from nest.problem.evaluate import make_problem
from nest.spec.settings import TrainingSettings
from tests.test_launchable import brute_force, tiny8

SPACE = {"zero_stages": [0, 3], "recompute_modes": ["none", "full"], "max_pp": 4}


def same(a, b) -> bool:
    """Plans equal but the solve time (and the search statistics of the notes)."""
    return replace(a, solve_time_s=0.0, notes="") == replace(b, solve_time_s=0.0, notes="")


@pytest.mark.parametrize("n,batch,blocks,hbm,idle", [(8, 3, 8, None, True),
                                                     (8, 3, 16, 4e9, True),
                                                     (8, 12, 8, None, False)])
def test_all_devices_search_after_the_search_equals_a_fresh_one(tmp_path, n, batch, blocks,
                                                                 hbm, idle):
    """Global batch 3: dp 3 or 1, so the optimum leaves devices idle (`nest plan` then runs
    the search on every device); batch 12: it uses them all."""
    model = tiny8(tmp_path, blocks)

    def problem():
        pr = make_problem(model, "tiny_cluster", n, training=TrainingSettings(global_batch=batch))
        return pr.with_hardware(hbm_bytes=hbm) if hbm else pr

    over = {"launchable": True, "mbs_options": [1, 2], "space": SPACE}
    seen = problem()
    first = run_planner("nest", seen, over)
    assert (first.plan.devices_used < n) == idle
    shared = all_devices_outcome("nest", seen, over)  # reads what the first search kept
    fresh = all_devices_outcome("nest", problem(), over)  # a new problem: nothing kept
    assert (shared.plan is None) == (fresh.plan is None)
    if fresh.plan is None:
        return
    assert same(shared.plan, fresh.plan)
    assert shared.evaluation.time_per_batch_s == fresh.evaluation.time_per_batch_s
    assert shared.plan.devices_used == n
    bf_T, bf_plan = brute_force(seen, {**SPACE, "min_devices": n}, (1, 2))
    assert fresh.evaluation.time_per_batch_s == pytest.approx(bf_T, rel=1e-9)
    # every device is a restriction: never faster
    assert bf_T >= first.evaluation.time_per_batch_s * (1 - 1e-12)


def test_with_mbs_is_one_problem_per_size():
    pr = make_problem("tiny_gpt", "tiny_cluster", 4, training=TrainingSettings(global_batch=8))
    two = pr.with_mbs(2)
    assert pr.with_mbs(2) is two and two.mbs == 2 and pr.with_mbs(1) is pr
    assert two.with_mbs(1).mbs == 1 and two.graph.variants == pr.graph.variants


def test_compute_bounds_do_not_depend_on_how_far_they_go():
    """nest.solver._bounds_pp reads a longer table for the search on every device: X_lb[p] is
    the same float whatever the largest p asked."""
    from nest.solver.dp import lower_bounds_per_column

    rng = np.random.default_rng(3)
    cost = np.cumsum(rng.random((12, 12, 3)), axis=0)
    long, short = lower_bounds_per_column(cost, 12), lower_bounds_per_column(cost, 5)
    assert np.array_equal(long[:6], short)


def test_interleaved_screen_memo_keeps_the_knobs_asked(tmp_path):
    """Fits share their knob-free results through the problem's cache, never the knobs: a knob
    not asked of this screen is not reported fitting though another screen found it fits, and
    floor0 equals a fresh problem's."""
    from nest.problem.space import declare
    from nest.solver.interleaved_screen import fits
    from nest.solver.launchable import interleaved_cuts

    def problem():
        return make_problem(tiny8(tmp_path, 16), "tiny_cluster", 8,
                            training=TrainingSettings(global_batch=16))

    pr = problem()
    var = declare(pr, SPACE).variants[0]
    cuts = interleaved_cuts(pr, 2, 2)
    a = fits(pr, var, 2, 2, 2, [(0, "none"), (3, "full")], cuts)
    assert a[(0, "none")] and a[(3, "full")]
    b = fits(pr, var, 2, 2, 2, [(3, "full")], cuts)
    assert not b[(0, "none")] and b[(3, "full")] and not b.get((0, "none"))
    c = fits(problem(), var, 2, 2, 2, [(0, "none")], cuts)
    assert all(c.floor0(z, r) == a.floor0(z, r) for z in (0, 3) for r in ("none", "full"))


def test_kept_joint_bounds_act_as_fresh_ones():
    """nest.solver._joint answers from a kept min-max: every answer is popped by the search
    (below the stop) exactly when a fresh joint_bound's is, and then is the same float, over
    stops below, at and above the bound in every order."""
    import itertools
    import math

    from nest.costs.layers import layer_table
    from nest.problem.space import declare, pp_dp_options
    from nest.solver import _joint, joint_key
    from nest.solver.bounds import joint_bound, joint_minmax

    pr = make_problem("tiny_gpt", "tiny_cluster", 8, training=TrainingSettings(
        global_batch=16)).with_hardware(hbm_bytes=3e9)
    space, checked = declare(pr, {"zero_stages": [1], "recompute_modes": ["none"]}), 0
    for var in space.variants[:3]:
        lts = [layer_table(pr, var, space.recompute_modes)]
        for p, d in list(pp_dp_options(pr, space, var))[:4]:
            B = joint_minmax(pr, space, lts, p, d)
            if not math.isfinite(B):
                continue
            stops = [B * 0.5, B * (1 - 1e-13), B, B * (1 + 1e-13), B * 2, math.inf]
            key = joint_key(space, lts, p, d)  # the memo _joint reads
            for order in itertools.permutations(stops, 3):
                pr.cache.get("joint_minmax", key, dict).clear()  # nothing kept
                for s in order:
                    fresh = joint_bound(pr, space, lts, p, d, s)  # keeps nothing
                    kept = _joint(pr, space, lts, p, d, s)
                    assert (kept < s) == (fresh < s)
                    if fresh < s:
                        assert kept == fresh
                    checked += 1
    assert checked > 100


@pytest.mark.parametrize("p,L", [(1, 5), (2, 6), (5, 9), (9, 9)])
def test_kept_bands_are_kept_cells_of_each_band(p, L):
    """nest.solver.bounds._kept_bands (every position at once) keeps the cells the former
    band-by-band rule keeps (`kept_cells`), and None where one keeps none."""
    import math

    from nest.solver.bounds import _band, _bands_flat, _kept_bands
    from nest.solver.positions import DROP_SLACK

    def kept_cells(floor_LL, band, stop_at):
        """The former per-band rule: the cells (b, a) whose floor is below stop_at
        (1 + DROP_SLACK); None if none."""
        a, b = band
        if math.isinf(stop_at):
            return b, a
        keep = floor_LL[b, a] < stop_at * (1 + DROP_SLACK)
        return (b[keep], a[keep]) if keep.any() else None

    rng = np.random.default_rng(p * 100 + L)
    bands = [_band(j, p, L) for j in range(p)]
    B, A, starts = _bands_flat(p, L)
    for _ in range(30):
        floor = rng.random((L, L)).round(2)  # ties with the stop included
        stop = float(rng.choice([0.05, 0.3, 0.5, 0.9, math.inf]))
        old = [kept_cells(floor, band, stop) for band in bands]
        new = _kept_bands(bands, floor[B, A], starts, stop)
        if any(c is None for c in old):
            assert new is None
            continue
        assert len(new) == p
        for (b0, a0), (b1, a1) in zip(old, new):
            assert np.array_equal(b0, b1) and np.array_equal(a0, a1)


def _lower_bounds_every_cell(cost_LLR, max_stages):
    """nest.solver.dp.lower_bounds_per_column as it was: the min over every first layer a."""
    L = cost_LLR.shape[0]
    cost = np.where(np.tril(np.ones((L, L), dtype=bool))[..., None], cost_LLR, np.inf)
    out = np.full((max_stages + 1, cost.shape[2]), np.inf)
    f = cost[:, 0].copy()
    out[1] = f[L - 1]
    for p in range(2, max_stages + 1):
        prev = np.concatenate([np.full((1, f.shape[1]), np.inf), f[:-1]])
        f = np.min(np.maximum(cost, prev[None, :, :]), axis=1)
        out[p] = f[L - 1]
    return out


@pytest.mark.parametrize("L,max_stages", [(1, 1), (4, 6), (9, 9), (17, 12)])
def test_lower_bounds_on_the_band_equal_every_cell(L, max_stages):
    """The min-max DP over cells b, a >= p - 1 only gives the floats of the DP over every cell
    (random range sums, some cells inf, more stages than layers)."""
    from nest.solver.dp import lower_bounds_per_column

    rng = np.random.default_rng(L)
    for _ in range(10):
        cost = np.cumsum(rng.random((L, L, 3)).round(1), axis=0)
        cost[rng.random((L, L, 3)) < 0.1] = np.inf
        assert np.array_equal(lower_bounds_per_column(cost, max_stages),
                              _lower_bounds_every_cell(cost, max_stages))
