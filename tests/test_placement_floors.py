"""The interleaved search's per-placement floor (nest.solver.interleaved_screen.placement_floors):
never above device_time_bounds (float for float), so never above the evaluator's time where that
bound is a floor; close to it (the sends and tied all-reduce are all it leaves out); and the
search with it returns what it returns without it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from nest.graph import build_graph
from tests.test_launchable import tiny8
from tests.test_speed_exact import interleaved_plans


def _problem(tmp_path, **training):
    from nest.problem.evaluate import make_problem
    from nest.problem.space import declare
    from nest.spec.settings import TrainingSettings

    build_graph.cache_clear()
    pr = make_problem(tiny8(tmp_path, 16), "tiny_cluster", 8,
                      training=TrainingSettings(global_batch=32, **training))
    space = declare(pr, {"zero_stages": [0, 1, 3], "recompute_modes": ["none", "full"],
                         "max_pp": 4, "heterogeneous_stages": False,
                         "placements": ["replica_major", "stage_major"]})
    return pr, space


@pytest.mark.parametrize("training", [{}, {"dp_overlap": "stage"}, {"dp_overlap": "bucketed"},
                                      {"pipeline_time": "critical_path"}])
def test_placement_floor_is_below_the_plan_bound_and_the_evaluator(tmp_path, training):
    """For every interleaved plan of a tiny model (every layout, placement and knob): the floor
    of its placement <= device_time_bounds <= the evaluator's time (the second where that bound
    is a floor: the paper's form); with the sync after the flush the floor is within the sends
    of the bound (ratio above 0.97 somewhere, so a floor of 0 would fail), and a floor raised
    by the sends it leaves out would exceed the bound (the assertion can fail)."""
    from nest.problem.evaluate import evaluate
    from nest.solver.interleaved_screen import placement_floors
    from nest.solver.launchable import device_time_bounds

    pr, space = _problem(tmp_path, **training)
    n, best_ratio, floors = 0, 0.0, {}
    for var, p, d, v, z, r, cuts, plan in interleaved_plans(pr, space, True):
        if (z, r) != (space.zero_stages[0], space.recompute_modes[0]):
            continue
        key = (var, p, d, v, tuple(cuts))
        if key not in floors:
            floors[key] = dict(placement_floors(pr, space, var, p, d, v, cuts))
        f = floors[key][plan.placement]
        lb = device_time_bounds(pr, space, plan)
        assert f.shape == lb.shape and np.all(f <= lb)
        best_ratio = max(best_ratio, float((f / lb).max()))
        for zi, z2 in enumerate(space.zero_stages):
            for ri, r2 in enumerate(space.recompute_modes):
                if pr.training.pipeline_time != "paper":
                    continue
                q = plan.with_(stages=tuple(replace(s, zero_stage=z2, recompute=r2)
                                            for s in plan.stages))
                assert f[zi, ri] <= evaluate(q, pr).time_per_batch_s
                n += 1
        n += 1
    assert len({pl for fl in floors.values() for pl in fl}) == 2  # both placements seen
    assert n > 60
    if not training:
        assert best_ratio > 0.97


def test_interleaved_search_is_the_same_without_the_floor(tmp_path, monkeypatch):
    """search_interleaved with the placement floors returns the same time, plan and number of
    evaluated plans as with floors that keep every placement (the search before them)."""
    import nest.solver.interleaved_screen as screen
    from nest.solver.launchable import search_interleaved

    pr, space = _problem(tmp_path)
    keep_all = lambda *a: [(pl, np.full((3, 2), -np.inf))  # noqa: E731
                           for pl in space.placements_for(a[2], a[3], a[4])]
    opt = search_interleaved(pr, space, np.inf)[0]
    assert np.isfinite(opt)
    for best_T in (np.inf, opt * 1.5, opt * 1.05, opt * (1 + 1e-6), opt, opt * 0.99):
        got = search_interleaved(pr, space, best_T)
        with monkeypatch.context() as mp:
            mp.setattr(screen, "placement_floors", keep_all)
            want = search_interleaved(pr, space, best_T)
        assert got[0] == want[0] and got[1] == want[1] and got[2] == want[2]


@pytest.mark.parametrize("model,cluster,n", [("tiny_moe", "tiny_cluster", 8),
                                             ("mixtral_mini", "dgx_h100_superpod", 64)])
def test_group_terms_of_some_modes_are_columns_of_all_modes(model, cluster, n):
    """nest.costs.groups: a table of some recomputation modes takes the all-modes table's
    group terms, its modes' columns; every field equals `_group_terms` of that table itself,
    byte for byte, through both ways in (group_terms per stage, placement_group_terms per
    placement), and so do the priced-alike keys kept per placement."""
    from nest.costs.alike import inner_groups, priced_alike_keys
    from nest.costs.groups import _group_terms, group_terms, placement_group_terms
    from nest.costs.layers import ALL_MODES, layer_table
    from nest.problem.evaluate import make_problem
    from nest.problem.plan import place
    from nest.problem.space import declare, pp_dp_options

    pr = make_problem(model, cluster, n)
    space = declare(pr, {"heterogeneous_stages": False})
    n_checked = 0
    for var in space.variants[:6]:
        for p, d in list(pp_dp_options(pr, space, var))[:4]:
            ids = place(p, d, var.width, "replica_major", tp=var.tp, cp=var.cp, ep=var.ep)
            for modes in [(r,) for r in ALL_MODES] + [ALL_MODES[:2], ALL_MODES]:
                lt = layer_table(pr, var, modes)
                direct = [_group_terms(pr, lt, i, d) for i in ids]
                via_stage = [group_terms(pr, lt, i, d) for i in ids]
                via_placement = placement_group_terms(pr, [lt], ids, d)[0]
                keys = priced_alike_keys(pr, [lt], inner_groups(np.asarray(ids), var.tp,
                                                               var.cp, var.ep, d))[0]
                again = placement_group_terms(pr, [lt], ids, d)[0]
                assert [g.content for g in again] == [g.content for g in via_placement]
                for want, a, b in zip(direct, via_stage, via_placement):
                    for g in (a, b):
                        assert g.names == want.names and g.dp_level == want.dp_level
                        assert g.dp_lines == want.dp_lines
                        for f in ("fwd_K", "cum_LK", "cum_LR", "layer_LR", "fwd_L"):
                            x, y = getattr(g, f), getattr(want, f)
                            assert x.shape == y.shape and x.tobytes() == y.tobytes(), f
                        assert g.content == want.content
                assert len(keys) == p
                n_checked += 1
    assert n_checked > 20


def _same(x, y, where=""):
    """x and y equal array for array, byte for byte (tuples, mappings, arrays, plain values)."""
    from collections.abc import Mapping

    if isinstance(x, Mapping):
        assert isinstance(y, Mapping) and set(x) == set(y), where
        for k in x:
            _same(x[k], y[k], f"{where}.{k}")
    elif isinstance(x, tuple):
        assert isinstance(y, tuple) and len(x) == len(y), where
        for i, (a, b) in enumerate(zip(x, y)):
            _same(a, b, f"{where}[{i}]")
    elif isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape == y.shape and x.dtype == y.dtype and x.tobytes() == y.tobytes(), where
    else:
        assert x == y, where


@pytest.mark.parametrize("training", [{}, {"dp_overlap": "bucketed"},
                                      {"param_gather_overlap": True, "dp_overlap": "stage"}])
def test_grid_of_one_mode_is_columns_of_every_mode(training):
    """nest.costs.stage.grid_terms: a table of some modes, with group terms that are columns
    of the all-modes terms, reads the all-modes grid under every ZeRO stage and mode: every
    term (times, memory, ZeRO parts, the overlapped tail's parts) equals `_terms` of that table
    and its options, byte for byte."""
    from nest.costs.groups import group_terms
    from nest.costs.layers import ALL_MODES, layer_table
    from nest.costs.stage import Options, _terms, grid_terms
    from nest.problem.evaluate import make_problem
    from nest.problem.plan import place
    from nest.problem.space import declare, pp_dp_options
    from nest.spec.settings import TrainingSettings

    pr = make_problem("mixtral_mini", "dgx_h100_superpod", 64,
                      training=TrainingSettings(global_batch=64, **training))
    space = declare(pr, {"heterogeneous_stages": False})
    checked = 0
    for var in space.variants[:4]:
        for p, d in list(pp_dp_options(pr, space, var))[1:3]:
            ids = place(p, d, var.width, "replica_major", tp=var.tp, cp=var.cp, ep=var.ep)
            for zs, modes in [((z,), (r,)) for z in (0, 1, 2, 3) for r in ALL_MODES] + [
                    ((3, 1), ALL_MODES[1:])]:
                lt = layer_table(pr, var, modes)
                gt = group_terms(pr, lt, ids[-1], d)
                assert gt.full is not None
                opts = Options(zs, modes)
                _same(grid_terms(pr, lt, gt, d, opts), _terms(pr, lt, gt, d, opts, None))
                checked += 1
    assert checked > 60
