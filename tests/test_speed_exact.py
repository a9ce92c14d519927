"""The planning speed-ups compute exactly what the slow ways did (issue 25, item 7)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nest.costs.pipeline import interleaved_order, interleaved_peak_activations


def walk_peak(act_C, p, m, d, group=None):
    """The peak as the schedule walks: one operation at a time (the former implementation)."""
    held = peak = 0.0
    for kind, c, _ in interleaved_order(p, m, len(act_C), d, group):
        held += act_C[c] if kind == "F" else -act_C[c]
        peak = max(peak, held)
    return peak


@settings(max_examples=300, deadline=None)
@given(p=st.integers(2, 8), k=st.integers(1, 6), v=st.integers(2, 5), d=st.integers(0, 7),
       group=st.one_of(st.none(), st.integers(1, 9)), extra=st.integers(0, 7),
       seed=st.integers(0, 2**31))
def test_interleaved_peak_is_the_walk_bit_for_bit(p, k, v, d, group, extra, seed):
    m, d = p * k + extra % p, d % p
    act = list(np.random.default_rng(seed).uniform(0, 1e9, v) / 7.0)
    assert interleaved_peak_activations(act, p, m, d, group) == walk_peak(act, p, m, d, group)
    act[0] = 0.0  # the Llama 3 405B layout: an embedding-only first chunk
    assert interleaved_peak_activations(act, p, m, d, group) == walk_peak(act, p, m, d, group)


def interleaved_plans(pr, space, overlap_p2p=None):
    """Every interleaved plan of the launchable space, every chunk layout:
    (var, p, d, v, z, r, cuts, plan). overlap_p2p True: pp 2 too, which Megatron-LM interleaves
    only with overlapped sends (default: the problem's overlap_p2p_comm, as the search)."""
    from nest.problem.space import pp_dp_options
    from nest.solver.launchable import (chunk_layouts, interleaved_cuts, interleaved_plan,
                                        virtual_options)

    blocks = pr.graph.num_layers - 2
    for var in space.variants:
        for p, d in pp_dp_options(pr, space, var):
            m = pr.num_microbatches(d, var.ep)
            for v in virtual_options(blocks, p, m, overlap_p2p=pr.training.overlap_p2p_comm
                                     if overlap_p2p is None else overlap_p2p):
                for lay in chunk_layouts(blocks, p, v):
                    cuts = interleaved_cuts(pr, p, v, lay)
                    for pl in space.placements_for(var, p, d):
                        for z in space.zero_stages:
                            for r in space.recompute_modes:
                                yield var, p, d, v, z, r, cuts, interleaved_plan(
                                    pr, var, p, d, v, pl, z, r, layout=lay)


def test_interleaved_screens_agree_with_the_evaluator(tmp_path):
    """nest.solver.interleaved_screen: `fits` says exactly whether the evaluator finds an
    interleaved plan within HBM (HBM set to peaks the plans reach, so both answers and the
    knife edge peak == HBM occur), and every plan takes at least its knob's floor bound."""
    from nest.problem.evaluate import evaluate, make_problem
    from nest.problem.space import declare
    from nest.solver.interleaved_screen import fits, live_knobs
    from nest.solver.launchable import interleaved_candidates, interleaved_cuts
    from nest.spec.settings import TrainingSettings
    from tests.test_launchable import tiny8

    pr0 = make_problem(tiny8(tmp_path, 16), "tiny_cluster", 8,
                       training=TrainingSettings(global_batch=32))
    over = {"zero_stages": [0, 1, 3], "recompute_modes": ["none", "selective", "full"],
            "max_pp": 4, "heterogeneous_stages": False}
    space = declare(pr0, over)
    peaks = sorted({max(s.peak_memory_bytes for s in evaluate(plan, pr0).stages)
                    for *_, plan in interleaved_plans(pr0, space)})
    assert len(peaks) > 10
    seen, floors = set(), 0
    for hbm in (peaks[len(peaks) // 3], peaks[len(peaks) // 2], peaks[-1] * 2):
        pr = pr0.with_hardware(hbm_bytes=hbm)
        bound_R = {(c[2], c[3], c[4], c[5], tuple(interleaved_cuts(pr, c[3], c[5], c[6]))): c[7]
                   for c in interleaved_candidates(pr, space)}  # the per-mode floors
        for var, p, d, v, z, r, cuts, plan in interleaved_plans(pr, space):
            ev = evaluate(plan, pr)
            fit = all(s.peak_memory_bytes <= hbm for s in ev.stages)
            screen = fits(pr, var, p, d, v, [(z, r)], cuts)
            assert screen[z, r] == fit and screen.any() == fit
            seen.add(fit)
            T = ev.time_per_batch_s
            key = (var, p, d, v, tuple(cuts))
            if key in bound_R:  # else no device group can hold its share of the states
                floors += 1
                assert (z, r) in live_knobs(space, bound_R[key], T * (1 + 1e-12))
            else:
                assert not fit
    assert seen == {True, False} and floors > 100


@pytest.mark.parametrize("model", ["tiny_moe", "tiny_llama", "tests/fixtures/hf/gemma_3_1b_pt.json"])
def test_meta_cache_leaves_the_graph_unchanged(model, monkeypatch):
    """nest.graph.meta_cache: the layer graph traced with remembered meta layouts equals, value
    for value, the graph traced running every meta kernel."""
    from nest.graph import build_graph, fx_extract, meta_cache
    from nest.spec.catalog import load_model

    m = load_model(model, seq_len=256)

    def fresh():
        build_graph.cache_clear()
        fx_extract.clear_caches()
        return build_graph(m, 2, "torch_fx").to_dict()

    meta_cache._LAYOUTS.clear()
    before = meta_cache.hits
    cached = fresh()
    assert meta_cache.hits > before  # calls were served from the cache
    monkeypatch.setattr(meta_cache, "call", lambda f, a, k: f(*a, **k))
    assert fresh() == cached
    build_graph.cache_clear()


def test_device_time_bounds_from_the_grid_bit_for_bit(tmp_path):
    """nest.solver.launchable.device_time_bounds reads the chunks' position-free terms from the
    whole-grid kernel (from_grid): the same bounds, bit for bit, as pricing every chunk's cell
    directly, on every interleaved plan (layouts and placements) of a tiny model."""
    from nest.problem.evaluate import make_problem
    from nest.problem.space import declare
    from nest.solver.launchable import device_time_bounds
    from nest.spec.settings import TrainingSettings
    from tests.test_launchable import tiny8

    pr = make_problem(tiny8(tmp_path, 16), "tiny_cluster", 8,
                      training=TrainingSettings(global_batch=32))
    space = declare(pr, {"zero_stages": [0, 1, 3], "recompute_modes": ["none", "full"],
                         "max_pp": 4, "heterogeneous_stages": False})
    n = 0
    for *_, z, r, _cuts, plan in interleaved_plans(pr, space, True):
        if (z, r) != (space.zero_stages[0], space.recompute_modes[0]):
            continue
        grid = device_time_bounds(pr, space, plan)
        direct = device_time_bounds(pr, space, plan, from_grid=False)
        assert grid.tobytes() == direct.tobytes()
        n += 1
    assert n > 10


@pytest.mark.parametrize("overlap", ["none", "stage", "bucketed"])
def test_device_time_bounds_with_the_sync_tail(tmp_path, overlap):
    """The interleaved search's per-plan floor (device_time_bounds) never exceeds the evaluator's
    time of the plan with those knobs on every chunk. Sync after the flush ("none", the paper's
    form, the defaults): it is that time, to the 1e-12 slack (the tail is the evaluator's own
    max over device groups of sync + optimizer step). Overlapped sync: device group 0's exposed
    sync and step floor, on a slow data-parallel link sometimes above the pipeline alone."""
    from dataclasses import replace

    from nest.problem.evaluate import evaluate, make_problem
    from nest.problem.space import declare
    from nest.solver.launchable import device_time_bounds
    from nest.spec.settings import TrainingSettings
    from tests.test_launchable import tiny8

    pr = make_problem(tiny8(tmp_path, 16), "tiny_cluster", 8,
                      training=TrainingSettings(global_batch=32, dp_overlap=overlap))
    assert pr.training.pipeline_time == "paper"
    space = declare(pr, {"zero_stages": [0, 1, 3], "recompute_modes": ["none", "full"],
                         "max_pp": 4, "heterogeneous_stages": False})
    n = above_pipe = 0
    for *_, z, r, _cuts, plan in interleaved_plans(pr, space, True):
        if (z, r) != (space.zero_stages[0], space.recompute_modes[0]):
            continue
        lb = device_time_bounds(pr, space, plan)
        for zi, z2 in enumerate(space.zero_stages):
            for ri, r2 in enumerate(space.recompute_modes):
                q = plan.with_(stages=tuple(replace(s, zero_stage=z2, recompute=r2)
                                            for s in plan.stages))
                ev = evaluate(q, pr)
                t = ev.time_per_batch_s
                assert lb[zi, ri] <= t
                n += 1
                if overlap == "none":
                    assert lb[zi, ri] == pytest.approx(t, rel=1e-9)
                else:
                    above_pipe += lb[zi, ri] > t - ev.breakdown_s.get(
                        "dp_sync_and_optimizer.exposed", 0.0) + 1e-12
    assert n > 60 and (overlap == "none" or above_pipe > 0)


@pytest.mark.parametrize("J,L,O", [(3, 24, 1), (5, 18, 4), (2, 30, 12)])
def test_jax_bottleneck_is_the_loop_on_solver_sizes(J, L, O):
    """The jitted JAX kernel equals the plain-Python recurrence on shapes the
    solver meets: one option (a launchable search) and twelve (ZeRO x recomputation), with ties
    (rounded values), cells out of memory and secondary values above the cap."""
    from nest.solver.dp import bottleneck, bottleneck_reference

    rng = np.random.default_rng(J * 1000 + L * 10 + O)
    for _ in range(3):
        prim = rng.random((J, L, L, O)).round(1)
        sec = rng.random((J, L, L, O))
        ok = rng.random((J, L, L, O)) < 0.7
        for cap in (0.3, 0.9, np.inf):
            got = bottleneck(prim, sec, ok, cap)
            ref = bottleneck_reference(prim.tolist(), sec.tolist(), ok.tolist(), cap)
            assert got[0] == ref[0] and got[1] == ref[1]


@pytest.mark.parametrize("grad_reduce", ["fp32", "bf16"])
def test_interleaved_group0_floor_is_the_exact_total_up_to_rounding(tmp_path, grad_reduce):
    """nest.solver.interleaved_screen.Fits.floor0 (the pre-screen on device group 0) is the
    evaluator's group-0 total (stage_memories, then device_memory, summed) within a relative
    1e-12, far inside the screen's 1e-9 margin: it never drops a knob that fits."""
    from nest.costs.pipeline import chunks_of
    from nest.costs.stage import stage_memories
    from nest.problem.evaluate import device_memory, make_problem
    from nest.problem.space import declare
    from nest.solver.interleaved_screen import MARGIN, fits
    from nest.spec.settings import TrainingSettings
    from tests.test_launchable import tiny8

    tr = TrainingSettings(global_batch=32).with_precision({"grad_reduce": grad_reduce})
    pr = make_problem(tiny8(tmp_path, 16), "tiny_cluster", 8, training=tr)
    space = declare(pr, {"zero_stages": [0, 1, 2, 3], "max_pp": 4,
                         "recompute_modes": ["none", "selective", "full"],
                         "heterogeneous_stages": False})
    hw, n = pr.cluster.hardware, 0
    for var, p, d, v, z, r, cuts, _ in interleaved_plans(pr, space, True):
        f = fits(pr, var, p, d, v, [(z, r)], cuts)
        ks = list(chunks_of(0, p, len(cuts)))
        mems = stage_memories(pr, f.lt, d, z, r, [f.held[k] for k in ks],
                              [cuts[k][0] for k in ks], [cuts[k][1] for k in ks])
        exact = sum(device_memory(mems, p, f.m, 0, f.held[0], hw).values())
        assert abs(f.floor0(z, r) - exact) <= 1e-12 * exact < MARGIN * exact
        n += 1
    assert n > 100


@pytest.mark.parametrize("model,cluster,n", [("tiny_moe", "dgx_h100_superpod", 16),
                                             ("tiny_llama", "gb200_nvl72", 144)])
def test_tables_of_some_modes_are_the_columns_of_all_modes(model, cluster, n):
    """nest.costs.layers.layer_table of a proper subset of ALL_MODES (its columns of the
    ALL_MODES table) equals the table built for those modes alone, array for array, and so does
    its collective floor (nest.solver.bounds.collective_floor_LR, every mode order)."""
    from dataclasses import fields
    from itertools import permutations

    from nest.costs.layers import ALL_MODES, _build, layer_table
    from nest.problem.problem import make_problem
    from nest.problem.space import declare
    from nest.solver.bounds import (_collective_floor_LR, collective_floor_LR,
                                    replica_blocks_aligned)

    pr = make_problem(model, cluster, n)
    space = declare(pr, {"heterogeneous_stages": True})
    subsets = [m for k in (1, 2) for m in permutations(ALL_MODES, k)]
    for v in space.variants[::3]:
        for modes in subsets:
            got, want = layer_table(pr, v, modes), _build(pr, v, modes)
            for f in fields(want):
                a, b = getattr(got, f.name), getattr(want, f.name)
                if isinstance(b, np.ndarray):
                    assert a.shape == b.shape and np.array_equal(a, b), (v.key, modes, f.name)
                elif f.name == "cum":
                    assert all(np.array_equal(a[k], b[k]) for k in b), (v.key, modes)
                else:
                    assert a == b, (v.key, modes, f.name)
            floor = collective_floor_LR(pr, got, space)
            aligned = replica_blocks_aligned(space)
            assert np.array_equal(floor, _collective_floor_LR(pr, want, aligned)), (v.key, modes)


@pytest.mark.parametrize("shape", [(1,), (7,), (63,), (63, 3), (10, 4, 2)])
def test_range_max_is_the_running_max_from_each_first_layer(shape):
    """nest.costs.layers.range_max (one running max down masked columns) equals accumulating
    from each first layer a, cell for cell (zeros where a > b), integer inputs included."""
    from nest.costs.layers import range_max

    rng = np.random.default_rng(len(shape))
    for x in (rng.random(shape) * 1e9, rng.integers(0, 10**6, shape)):
        n = x.shape[0]
        want = np.zeros((n, n) + x.shape[1:])
        for a in range(n):
            want[a:, a] = np.maximum.accumulate(x[a:], axis=0)
        got = range_max(x)
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_interleaved_candidates_below_a_time_are_the_prefix_of_all(tmp_path):
    """interleaved_candidates(..., below=x), which passes over a whole (variant, p, d) by the
    mean of its groups' floors, lists exactly the candidates of the full list whose bound is
    below x, in the same order (search_interleaved stops at the first one not below its best)."""
    from nest.problem.evaluate import make_problem
    from nest.problem.space import declare
    from nest.solver.launchable import interleaved_candidates
    from nest.spec.settings import TrainingSettings
    from tests.test_launchable import tiny8

    pr = make_problem(tiny8(tmp_path, 16), "tiny_cluster", 8,  # pp 2 interleaves too
                      training=TrainingSettings(global_batch=32, overlap_p2p_comm=True))
    space = declare(pr, {"zero_stages": [0, 3], "recompute_modes": ["none", "full"],
                         "max_pp": 8, "heterogeneous_stages": False})
    every = interleaved_candidates(pr, space)
    bounds = sorted({c[0] for c in every})
    assert len(bounds) > 10
    for x in (bounds[0], bounds[len(bounds) // 4], bounds[len(bounds) // 2], bounds[-1],
              bounds[-1] * 2):
        key = [(c[0], c[1]) for c in every if c[0] < x]
        assert [(c[0], c[1]) for c in interleaved_candidates(pr, space, below=x)] == key


@pytest.mark.parametrize("model", ["tiny_moe", "tests/fixtures/hf/deepseek_v3.json"])
def test_one_mode_compute_bounds_are_columns_of_the_per_mode_ones(model):
    """compute_bounds of a one-mode search (the launchable searches) reads its column of
    per_mode_bounds (all modes at once): the same floats as the bounds computed from that
    mode's tables alone (floor_LR, range_sum, lower_bounds), every p and cell."""
    import numpy as np

    from nest.costs.layers import ALL_MODES, layer_table, range_sum
    from nest.problem.evaluate import make_problem
    from nest.problem.space import declare
    from nest.solver import bounds
    from nest.solver.dp import lower_bounds

    pr = make_problem(model, "tiny_cluster" if model == "tiny_moe" else "dgx_h100_superpod",
                      8 if model == "tiny_moe" else 64, seq_len=None if model == "tiny_moe"
                      else 4096, launchable_only=True)
    for v in pr.graph.variants[:6]:
        for r in ALL_MODES:
            space = declare(pr, {"zero_stages": [1], "recompute_modes": [r],
                                 "heterogeneous_stages": False})
            lts = [layer_table(pr, v, (r,))]
            lb, table = bounds.compute_bounds(pr, space, lts, 7)
            floor = bounds.floor_LR(pr, lts, space)
            L = floor.shape[0]
            want_table = np.where(np.tri(L, dtype=bool)[..., None], range_sum(floor), np.inf)
            np.testing.assert_array_equal(table, want_table)
            np.testing.assert_array_equal(lb, lower_bounds(range_sum(floor[:, 0]), 7))
