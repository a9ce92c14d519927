"""The knob searches of `nest plan` (nest.solver.launchable.search_launchable: one 1F1B search per
ZeRO stage and recomputation mode) drop a candidate before its joint bound when the union's
joint bound (nest.solver._union_floor, every knob's options at once) shows it reaches the best
time. Checked against what it replaces: the floor is at most every knob's joint min-max priced
alone (and equal to their least on one stage, where nothing couples the stages), and the
launchable search returns the same plan, time and statistics with and without it."""

from __future__ import annotations

import math

import pytest

from nest.costs.layers import layer_table
from nest.problem.evaluate import make_problem
from nest.problem.space import declare, pp_dp_options
from nest.solver import _union_floor, joint_key
from nest.solver.bounds import joint_minmax
from nest.solver.launchable import launchable_space, search_launchable
from nest.spec.settings import TrainingSettings

CASES = [("tiny_gpt", "tiny_cluster", 8, 16, 3e9), ("tiny_gpt", "tiny_cluster", 8, 4, None),
         ("tiny_moe", "tiny_cluster", 8, 16, None), ("tiny_llama", "gb200_nvl72", 144, 64, None),
         ("tiny_moe", "tiny_cluster", 8, 8, 2e9)]


def problem(model, cluster, n, batch, hbm):
    pr = make_problem(model, cluster, n, training=TrainingSettings(global_batch=batch))
    return pr.with_hardware(hbm_bytes=hbm) if hbm else pr


def candidates(pr):
    """(base space, variant, the union's tables, p, d, [(knob space, its tables)]) for a sample
    of the launchable space's candidates, each knob one ZeRO stage and recomputation mode."""
    base = launchable_space(declare(pr, {"heterogeneous_stages": False}), pr)
    for var in base.variants[::3]:
        ults = [layer_table(pr, var, base.recompute_modes)]
        for p, d in list(pp_dp_options(pr, base, var))[::4]:
            knobs = [(base.with_(zero_stages=(z,), recompute_modes=(r,)),
                      [layer_table(pr, var, (r,))])
                     for z in base.zero_stages for r in base.recompute_modes]
            yield base, var, ults, p, d, knobs


@pytest.mark.parametrize("case", CASES[:4])
def test_union_floor_is_below_every_knobs_joint_bound(case):
    pr = problem(*case)
    checked = tight = 0
    for base, var, ults, p, d, knobs in candidates(pr):
        least = min(joint_minmax(pr, sp, lts, p, d) for sp, lts in knobs)
        stops = [math.inf] + ([least * 0.5, least, least * 2] if math.isfinite(least) else [])
        for s in stops:
            # priced at this stop, nothing kept
            pr.cache.get("union_joint", joint_key(base, ults, p, d), dict).clear()
            f = _union_floor(pr, base, ults, p, d, s)
            assert f <= least, (var.key, p, d, s, f, least)
            if p == 1 and math.isfinite(least) and math.isinf(s):  # one stage: the least
                assert f == pytest.approx(least, rel=1e-8)
                tight += 1
            checked += 1
    assert checked > 10 and tight > 0


@pytest.mark.parametrize("case", CASES)
def test_launchable_search_is_the_same_with_the_union_bound(case, monkeypatch):
    import nest.solver as solver

    asked = {"joint": 0}
    joint = solver._joint

    def counted(*a):
        asked["joint"] += 1
        return joint(*a)

    monkeypatch.setattr(solver, "_joint", counted)
    out = {}
    for union in (False, True):
        asked["joint"] = 0
        settings = {"launchable": True, "mbs_options": [1, 2], "union_bound": union}
        T, plan, stats, pr = search_launchable(problem(*case), settings)
        out[union] = (T, plan, {k: v for k, v in stats.items() if k != "tied_space"},
                      stats.get("tied_space"), pr.mbs, asked["joint"])
    assert out[True][:5] == out[False][:5]
    assert out[True][5] < out[False][5]  # it dropped candidates (53 -> 33 joint bounds, ...)


@pytest.mark.parametrize("case", CASES[:4])
def test_union_placement_floors_skip_only_placements_at_the_stop(case):
    """The union's per-placement floors (nest.solver.union_placement_floors) are at most every
    knob's own min-max of that placement (priced alone, stop inf), and a knob's joint min-max
    with them is the one without them where below the stop, at or above the stop elsewhere."""
    from nest.solver import union_placement_floors

    pr = problem(*case)
    checked = skipped = 0
    for base, var, ults, p, d, plain in candidates(pr):
        knobs = []
        for sp, lts in plain:
            per: dict = {}
            knobs.append((sp, lts, joint_minmax(pr, sp, lts, p, d, math.inf, None, per), per))
        least = min(k[2] for k in knobs)
        if not math.isfinite(least):
            continue
        for s in (least * 0.5, least, least * 1.01, least * 2):
            pr.cache.get("union_joint", joint_key(base, ults, p, d), dict).clear()
            _union_floor(pr, base, ults, p, d, s)
            floors = union_placement_floors(pr, base, ults, p, d)
            for sp, lts, exact, per in knobs:
                for pl, f in floors.items():
                    assert f <= per[pl][0], (var.key, p, d, pl, f, per[pl])
                fast = joint_minmax(pr, sp, lts, p, d, s, floors)
                slow = joint_minmax(pr, sp, lts, p, d, s)
                if slow < s or fast < s:
                    assert fast == slow == exact, (var.key, p, d, s, fast, slow, exact)
                assert fast >= exact
                skipped += sum(f >= s for f in floors.values())
                checked += 1
    assert checked > 10 and skipped > 0
