"""The solver's joint and memory-aware bounds (nest.solver.bounds, nest.solver.positions) are the
same floats as the plain computation they replace: every stage position priced cell by cell with
nest.costs.stage.stage_cost and a min-max DP over the full [b, a] grid of every stage (the code
below, as the bounds were computed before issue 27's solve-time work). Bit-identical bounds give
the search the same order of candidates, the same visited counts and the same plans. With the
search's best time as stop_at the joint bound is unchanged where it is below it and at or above
it elsewhere. Random instances (tests/strategies.py) and shipped clusters of every topology kind
(scale-up NVL72 racks, rail-optimised, a torus, a graph file)."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nest.costs.alike import inner_groups, priced_alike, priced_alike_keys
from nest.costs.layers import layer_table
from nest.costs.pipeline import bottleneck_weight, links, solver_form, stash
from nest.costs.stage import stage_cost
from nest.problem.plan import place
from nest.problem.problem import make_problem
from nest.problem.space import declare, pp_dp_options
from nest.solver import bounds
from nest.spec.settings import TrainingSettings
from strategies import build, instance_specs

HYPOTHESIS = dict(derandomize=True, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def minmax_over_full_grid(cost_of, p: int, L: int, send_fwd_L, send_bwd_L) -> float:
    """min over cuts into p stages of max_j (cost_j[b, a] + sends), every stage on the full
    [b, a] grid (a > b: inf)."""
    valid = np.tril(np.ones((L, L), dtype=bool))
    f = None
    for j in range(p):
        cost = np.where(valid, cost_of(j), np.inf)
        if j < p - 1:
            cost = cost + send_fwd_L[:, None]
        if j > 0:
            cost = cost + send_bwd_L[None, :]
        if f is None:
            f = cost[:, 0].copy()
        else:
            prev = np.concatenate([[np.inf], f[:-1]])
            f = np.min(np.maximum(cost, prev[None, :]), axis=1)
    return float(f[L - 1])


def plain_joint_bound(problem, space, lts, p: int, d: int) -> float:
    """The joint bound priced position by position with stage_cost on each band."""
    v0, L = lts[0].variant, lts[0].num_layers
    m = problem.num_microbatches(d, v0.ep)
    C = bottleneck_weight(solver_form(problem.training), m, p)
    hbm, opts, zeros_L = problem.cluster.hardware.hbm_bytes, space.options, np.zeros(L)
    best = math.inf
    for placement in space.placements_for(v0, p, d):
        ids = place(p, d, v0.width, placement, tp=v0.tp, cp=v0.cp, ep=v0.ep)
        cost_J = []
        for j in range(p):
            a, b = bounds._band(j, p, L)
            cost = None
            for lt in lts:
                c = stage_cost(problem, lt, ids[j], d, opts, stash(p, j, m), cell=(a, b),
                               **links(ids, j))
                after = (c.u[..., None] if c.tail is None
                         else np.maximum(c.tail, 0.0) if j == 0 else 0.0)
                x = np.where(c.mem <= hbm, C * c.t + after, np.inf).min(axis=(-2, -1))
                cost = x if cost is None else np.minimum(cost, x)
            full = np.full((L, L), np.inf)
            full[b, a] = cost
            cost_J.append(full)
        best = min(best, minmax_over_full_grid(cost_J.__getitem__, p, L, zeros_L, zeros_L))
    return best * (1 - 1e-12)


def plain_memory_aware_bound(problem, space, lts, p: int, floor_LLR, send_floors) -> float:
    v, L = lts[0].variant, lts[0].num_layers
    d = bounds.largest_dp(problem, v, p)
    m = problem.num_microbatches(d, v.ep)
    max_stash_LLR = np.max([bounds._max_stash(problem, space, lt, d).max(axis=2)
                            for lt in lts], axis=0)
    return minmax_over_full_grid(
        lambda j: np.where(max_stash_LLR >= stash(p, j, m), floor_LLR, np.inf).min(axis=2),
        p, L, *send_floors)


def assert_bounds_as_plain(problem, space, max_candidates: int | None = None) -> int:
    """Every candidate's joint and memory-aware bound == the plain one, bit for bit; the joint
    bound with stop_at below, at and above it as the search relies on. Returns the count."""
    n = 0
    for cls in space.classes:
        lts = [layer_table(problem, v, space.recompute_modes) for v in cls]
        options = list(pp_dp_options(problem, space, cls[0]))
        if not options:
            continue
        if max_candidates:
            options = options[::max(1, len(options) // max_candidates)]
        _, floor_LLR = bounds.compute_bounds(problem, space, lts, max(p for p, _ in options))
        sends = bounds.p2p_floor(problem, lts, space)
        for p in sorted({p for p, _ in options}):
            got = bounds.memory_aware_bound(problem, space, lts, p, floor_LLR, sends)
            assert got == plain_memory_aware_bound(problem, space, lts, p, floor_LLR, sends), p
        for p, d in options:
            want = plain_joint_bound(problem, space, lts, p, d)
            assert bounds.joint_bound(problem, space, lts, p, d) == want, (p, d)
            for stop in (want * 0.97, want, want * 1.03, math.inf):
                got = bounds.joint_bound(problem, space, lts, p, d, stop)
                assert got == want if want < stop else got >= stop, (p, d, stop, got, want)
            n += 1
    return n


@settings(max_examples=30, **HYPOTHESIS)
@given(instance_specs(), st.sampled_from(("none", "bucketed")))
def test_bounds_equal_plain_computation(spec, dp_overlap):
    """Random instances (2-4 levels, any node size, tight and roomy HBM, every placement kind,
    heterogeneous classes), with and without the overlapped gradient sync."""
    problem, space = build(spec)
    assert_bounds_as_plain(problem.with_training(dp_overlap=dp_overlap), space)


SHIPPED = [("tiny_llama", "gb200_nvl72", 144), ("tiny_gpt", "dgx_h100_rail_superpod", 256),
           ("tiny_llama", "tpuv4_torus", 64), ("tiny_gpt", "dragonfly_h100_graph", 64)]


@pytest.mark.parametrize("model,cluster,n", SHIPPED)
def test_bounds_equal_plain_computation_on_shipped_clusters(model, cluster, n):
    """A scale-up NVL72 cluster (stages that straddle 72-GPU racks), the rail-optimised
    SuperPOD, the TPU v4 torus and a graph-file cluster, the paper's heterogeneous space."""
    pr = make_problem(model, cluster, n, training=TrainingSettings(global_batch=64))
    space = declare(pr, {"heterogeneous_stages": True})
    assert assert_bounds_as_plain(pr, space, max_candidates=12) > 0


@pytest.mark.parametrize("model,cluster,n", SHIPPED[:3])
def test_priced_alike_keys_of_a_placement_equal_each_stage_key(model, cluster, n):
    """The keys computed for every stage position at once equal each stage's own
    `priced_alike` key, and stages with equal keys have equal group terms (the cache's
    premise): on every placement of a few candidates."""
    from nest.costs.groups import _group_terms

    pr = make_problem(model, cluster, n, training=TrainingSettings(global_batch=64))
    space = declare(pr, {"heterogeneous_stages": True})
    cls = space.classes[-1]
    lts = [layer_table(pr, v, space.recompute_modes) for v in cls]
    v, seen = cls[0], {}
    for p, d in list(pp_dp_options(pr, space, v))[::7]:
        for placement in space.placements_for(v, p, d):
            ids = place(p, d, v.width, placement, tp=v.tp, cp=v.cp, ep=v.ep)
            keys = priced_alike_keys(pr, lts, inner_groups(np.asarray(ids), v.tp, v.cp,
                                                           v.ep, d))
            for lt, per_stage in zip(lts, keys):
                for i, key in zip(ids, per_stage):
                    assert key == priced_alike(pr, lt, inner_groups(i, v.tp, v.cp, v.ep, d))
                    gt = _group_terms(pr, lt, i, d)
                    first = seen.setdefault((id(lt), d, key), gt)
                    assert (first.names, first.dp_level) == (gt.names, gt.dp_level)
                    for f in ("fwd_K", "cum_LK", "cum_LR"):
                        np.testing.assert_array_equal(getattr(first, f), getattr(gt, f))
                    assert first.content == gt.content
    assert len(seen) > 1


def test_class_arrays_are_the_kernel_stacked():
    """nest.solver.arrays.class_arrays writes each position's kernel arrays in place: the same
    arrays as stacking stage_cost's per position, the variants' options side by side."""
    import numpy.testing as npt

    from nest.solver.arrays import class_arrays

    pr = make_problem("gpt3_175b", "gb200_nvl72", 1152,
                      training=TrainingSettings(global_batch=256))
    space = declare(pr, {"heterogeneous_stages": True})
    cls = max(space.classes, key=len)
    assert len(cls) > 1
    lts = [layer_table(pr, v, space.recompute_modes) for v in cls]
    v = cls[0]
    for p, d in list(pp_dp_options(pr, space, v))[::9][:4]:
        for placement in space.placements_for(v, p, d):
            arr = class_arrays(pr, space, lts, p, d, placement)
            m = pr.num_microbatches(d, v.ep)
            L = lts[0].num_layers
            ts, us, oks = [], [], []
            for j, ids in enumerate(arr.device_ids):
                cs = [stage_cost(pr, lt, ids, d, space.options, stash(p, j, m),
                                 **links(arr.device_ids, j)) for lt in lts]
                ts.append(np.concatenate([c.t.reshape(L, L, -1) for c in cs], axis=-1))
                us.append(np.concatenate([c.u for c in cs], axis=-1))
                valid = np.tril(np.ones((L, L), dtype=bool))[..., None]
                oks.append(np.concatenate([(c.mem <= pr.cluster.hardware.hbm_bytes).reshape(
                    L, L, -1) & valid for c in cs], axis=-1))
            npt.assert_array_equal(arr.t_JLLO, np.stack(ts))
            npt.assert_array_equal(arr.u_JLLZ, np.stack(us))
            npt.assert_array_equal(arr.ok_JLLO, np.stack(oks))


@pytest.mark.parametrize("inf_share", [0.2, 0.6])
@pytest.mark.parametrize("seed", range(6))
def test_minmax_bands_is_the_full_grid_dp(seed, inf_share):
    """The memory-aware bound's band DP (bounds.minmax_bands on bounds.band_view) against the
    full-grid DP above and against nest.solver.positions.minmax_cells on the band cells, on
    random costs with unreachable cells (inf; the larger share makes whole stages unreachable,
    minmax_bands' early return), with and without sends, every p from 1 to L."""
    from nest.solver.positions import minmax_cells

    rng = np.random.default_rng(seed)
    L = int(rng.integers(1, 16))
    cost_LL = np.where(rng.random((L, L)) < inf_share, np.inf, rng.random((L, L)))
    sends = (rng.random(L) * 0.1, rng.random(L) * 0.1)
    for p in range(1, L + 1):
        # a stage-dependent cost, as the stash makes it: cells above a threshold drop out
        cost_J = [np.where(cost_LL <= 1 - 0.05 * j, cost_LL, np.inf) for j in range(p)]
        x = np.array([bounds.band_view(np.where(np.tri(L, dtype=bool), c, np.inf),
                                       p, L - p + 1)[j] for j, c in enumerate(cost_J)])
        rows = [(b, a, cost_J[j][b, a]) for j, (a, b) in
                ((j, bounds._band(j, p, L)) for j in range(p))]
        for s in ((None, None), sends):
            want = minmax_over_full_grid(cost_J.__getitem__, p, L,
                                         *(np.zeros(L) if x_ is None else x_ for x_ in s))
            assert bounds.minmax_bands(x, *s) == want == minmax_cells(rows, L, *s), (p, s)


def test_placement_rows_read_once_per_group_as_plain():
    """nest.solver.positions reads the grid terms, floors and sends once per group of positions
    priced alike (`_alike`, `_gather`): every position's row is still the plain per-position
    price (stage_cost on its band, least over variants and options that fit), with and without
    a stop, on placements whose positions fall in one group and in several (NVL72 racks
    straddled: stages priced unlike)."""
    from nest.costs.groups import placement_group_terms
    from nest.costs.stage import grid_terms
    from nest.solver import positions

    pr = make_problem("tiny_llama", "gb200_nvl72", 144, training=TrainingSettings(global_batch=64))
    space = declare(pr, {"heterogeneous_stages": True})
    hbm, opts, sizes = pr.cluster.hardware.hbm_bytes, space.options, set()
    for cls in space.classes:
        lts = [layer_table(pr, v, space.recompute_modes) for v in cls]
        v, L = cls[0], lts[0].num_layers
        for p, d in list(pp_dp_options(pr, space, v))[::5]:
            m = pr.num_microbatches(d, v.ep)
            C = bottleneck_weight(solver_form(pr.training), m, p)
            stash_J = [stash(p, j, m) for j in range(p)]
            cells = [bounds._band(j, p, L)[::-1] for j in range(p)]
            for placement in space.placements_for(v, p, d):
                ids = place(p, d, v.width, placement, tp=v.tp, cp=v.cp, ep=v.ep)
                for gts in placement_group_terms(pr, lts, np.asarray(ids), d):
                    terms = [grid_terms(pr, lts[0], gt, d, opts) for gt in gts]
                    sizes.add(len(positions._alike(terms)))
                plain = []
                for j, (b, a) in enumerate(cells):
                    cost = None
                    for lt in lts:
                        c = stage_cost(pr, lt, ids[j], d, opts, stash_J[j], cell=(a, b),
                                       **links(ids, j))
                        assert c.tail is None  # the default dp_overlap: none
                        x = np.where(c.mem <= hbm, C * c.t + c.u[..., None], np.inf).min(axis=(-2, -1))
                        cost = x if cost is None else np.minimum(cost, x)
                    plain.append(cost)
                stop = float(np.median(np.concatenate(plain)[np.isfinite(np.concatenate(
                    plain))])) if np.isfinite(np.concatenate(plain)).any() else math.inf
                for s in (math.inf, stop):
                    rows = positions.placement_rows(pr, lts, ids, d, opts, C, stash_J, cells, s)
                    for (b, a, got), want, (b0, a0) in zip(rows, plain, cells):
                        np.testing.assert_array_equal(b, b0)
                        np.testing.assert_array_equal(a, a0)
                        below = want < s
                        np.testing.assert_array_equal(got[below], want[below])
                        assert ((got == want) | np.isinf(got)).all()
    assert 1 in sizes and max(sizes) > 1, sizes  # both paths of `_gather` ran


@settings(max_examples=60, **HYPOTHESIS)
@given(st.integers(1, 12).flatmap(lambda p: st.tuples(
    st.lists(st.integers(0, p - 1), min_size=p, max_size=p),
    st.lists(st.integers(0, p - 1), max_size=60))))
def test_parts_are_the_isin_of_each_group(data):
    """nest.solver.positions._parts: each group's cell indices, from one stable sort, are
    np.flatnonzero(np.isin(pos, group)) (what `_gather` computed per group before), in the
    groups' order; with one group, None (every cell)."""
    from nest.solver import positions

    labels, pos = data
    terms = [object() for _ in range(max(labels) + 1)]
    groups = positions._alike([terms[g] for g in labels])
    pos = np.sort(np.asarray(pos, dtype=np.int64))
    parts = positions._parts(groups, pos)
    assert [j for j, _ in parts] == [j for j, _ in groups]
    if len(groups) == 1:
        assert parts[0][1] is None
        return
    for (_, js), (_, idx) in zip(groups, parts):
        np.testing.assert_array_equal(idx, np.flatnonzero(np.isin(pos, js)))
