"""Candidate (variant, p, d) -> lower bounds on its optimum time per batch, from the stage kernel.

The solver visits candidates in order of these bounds and stops when the next bound reaches the
best time found (branch and bound), so each must never exceed the exact optimum of its candidate
over every cut, option and placement of the space. Each function states its relaxation; all
prices come from nest.costs.stage (its layer tables, group terms, ZeRO schedule and memory model)
and rest on two monotonicity facts of that kernel: every collective, transfer and optimizer time
is non-decreasing in its bytes (alpha-beta lines with beta >= 0), and a stage's time is a sum of
per-layer terms. tests/test_bounds.py checks every bound against the exact optimum on random
clusters (2-4 levels, oversubscribed and flattened), d not a multiple of the node size, tied and
untied, dense and MoE models.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from nest.costs.cache import read_only
from nest.costs.groups import group_terms
from nest.costs.layers import ALL_MODES, LayerTable, layer_table, range_sum, subset_of_all
from nest.costs.pipeline import bottleneck_weight, solver_form, stash, stash_capacity
from nest.costs.stage import Options, fixed_and_step_bytes
from nest.graph.layer_graph import Variant
from nest.network.collectives import path_bandwidth
from nest.problem.plan import place
from nest.problem.problem import Problem
from nest.problem.space import SearchSpace
from nest.solver.positions import (DROP_SLACK, compute_floor, minmax_cells,
                                   placement_rows)

ALIGNED = ("replica_major", "stage_major")  # placements whose replicas are aligned id blocks


def replica_blocks_aligned(space: SearchSpace) -> bool:
    """Whether every placement of the space puts each replica on an aligned block of `width`
    consecutive ids, in the canonical inner order (tp fastest, then cp, then ep), as the legacy
    placements and the orders starting tp-cp-ep do; a stage of any variant of the class then
    splits each block the way `collective_floor_LR` prices it."""
    return all(pl in ALIGNED or pl != "orders" and pl.split("-")[:3] == ["tp", "cp", "ep"]
               for pl in space.placements)


def collective_floor_LR(problem: Problem, lt: LayerTable, space: SearchSpace) -> np.ndarray:
    """Per layer and recomputation mode, a floor on the variant's collectives in any stage.
    Relaxation: a stage's collective of a group kind costs at least that collective on one of
    its replicas, and every replica is an aligned block [k w, (k+1) w) (`replica_blocks_aligned`),
    so the cheapest block (over its distinct shapes) bounds every stage, whatever the level
    costs do (flattened clusters: a cross-node group can be faster than an intra-node one).
    Without aligned replicas: 0 (no floor). Kept in the table's derived store (it reads only
    the table, the cluster and whether the space's replicas are aligned); a table of some of
    ALL_MODES takes its columns of the ALL_MODES table's (group terms are per mode column by
    column, nest.costs.groups)."""
    aligned = replica_blocks_aligned(space)

    def make():
        idx = subset_of_all(lt.modes)  # a table of ALL_MODES' columns: the columns of its floor
        if idx is not None:
            full = layer_table(problem, lt.variant, ALL_MODES)
            return read_only(collective_floor_LR(problem, full, space)[:, idx])
        return read_only(_collective_floor_LR(problem, lt, aligned))

    return problem.cache.get(lt.store, ("collective_floor_LR", aligned), make)


def _collective_floor_LR(problem: Problem, lt: LayerTable, aligned: bool) -> np.ndarray:
    v, L = lt.variant, lt.num_layers
    out = np.zeros((L, len(lt.modes)))
    if v.width == 1 or not aligned:
        return out
    from nest.network.collectives import distinct

    n = problem.num_devices // v.width
    blocks = np.arange(n * v.width).reshape(n, v.width)
    best = None
    for blk in distinct(problem.cluster, blocks):
        gt = group_terms(problem, lt, tuple(blk), 1)
        row = np.diff(gt.cum_LR, axis=0)  # per layer, per mode
        best = row if best is None else np.minimum(best, row)
    return best


def floor_LR(problem: Problem, lts, space: SearchSpace) -> np.ndarray:
    """Per layer and mode, a floor on its share of any stage's time per micro-batch: its compute
    (exact) plus `collective_floor_LR`, the least over the class's variants (`lts`: one layer
    table per variant a stage may pick)."""
    return np.min([lt.comp_LR + collective_floor_LR(problem, lt, space) for lt in lts], axis=0)


def p2p_floor(problem: Problem, lts, space: SearchSpace):
    """Floors on a stage's pipeline sends, per boundary layer (forward: by its last layer b,
    backward: by its first layer a). Relaxation: the devices of consecutive stages are at least
    `stride` ids apart (stage-major: width, replica-major: d * width >= width; an order string:
    the product of the degrees faster than pp, d counted as 1), so a pair meets at the lowest
    level whose groups hold more than `stride` ids, or above; the cheapest of those levels
    prices the transfer (no monotonicity of levels assumed). Kept in the problem's cache by the
    class's variants and the space's placements, all it reads besides the cluster (a table of
    some recomputation modes has the all-modes table's out_L)."""
    key = (tuple(lt.variant for lt in lts), space.placements)
    return problem.cache.get("p2p_floor", key,
                             lambda: read_only(_p2p_floor(problem, lts, space)))


def _p2p_floor(problem: Problem, lts, space: SearchSpace):
    cl = problem.cluster
    stride = min(_pp_stride(pl, lt.variant) for pl in space.placements for lt in lts)
    levels = [i for i, lv in enumerate(cl.levels) if lv.devices_per_group > stride] or [
        len(cl.levels) - 1]

    def floor(nbytes: np.ndarray) -> np.ndarray:
        t = np.min([nbytes / path_bandwidth(cl, lv) + cl.levels[lv].latency_s for lv in levels],
                   axis=0)
        return np.where(nbytes > 0, t, 0.0)

    out_L = np.min([lt.out_L for lt in lts], axis=0)  # each stage sends in its own layout
    return floor(out_L), floor(np.concatenate([[0.0], out_L[:-1]]))


def _pp_stride(placement: str, v: Variant) -> int:
    if placement in ALIGNED:
        return v.width
    if placement == "orders":  # any launcher order: pp may be the fastest dimension
        return 1
    size = {"tp": v.tp, "cp": v.cp, "ep": v.ep, "dp": 1, "pp": 1}
    dims = placement.split("-")
    return max(1, math.prod(size[k] for k in dims[:dims.index("pp")]))


def largest_dp(problem: Problem, v: Variant, p: int) -> int:
    return max(1, min(problem.num_devices // (p * v.width),
                      problem.training.global_batch // (problem.mbs * v.ep)))


def memory_aware_bound(problem: Problem, space: SearchSpace, lts, p: int,
                       floor_LLR: np.ndarray, send_floors) -> float:
    """X_lb(p): a lower bound on the bottleneck stage time max_j t_j of any plan with p stages
    and any d. Relaxation: stage j's time is at least its floor (`floor_LR` + `p2p_floor`) with
    the cheapest recomputation mode that fits at its position under the most favourable d (the
    largest: the most ZeRO sharding and the fewest micro-batches to stash; fewer replicas only
    need more memory) and the most favourable ZeRO stage; a min-max DP over the cuts
    (`minmax_bands`: every stage's band of cells at once)."""
    v, L = lts[0].variant, lts[0].num_layers
    d = largest_dp(problem, v, p)
    m = problem.num_microbatches(d, v.ep)
    # the most any variant of the class can stash, per mode, under its best ZeRO stage
    cap = functools.reduce(np.maximum, [problem.cache.get(lt.store, (
        "max_stash_R", d, space.zero_stages), lambda lt=lt: read_only(
            _max_stash(problem, space, lt, d).max(axis=2))) for lt in lts])
    n = L - p + 1
    s = np.array([stash(p, j, m) for j in range(p)])[:, None, None]
    fl, cp = band_view(floor_LLR, p, n), band_view(cap, p, n)
    # the last stage ends at layer L - 1: where none of its cells [a, L - 1] fits, no cut does
    # (`minmax_bands` would return inf: the same value, without the other stages' cells)
    if np.minimum.reduce(np.where(cp[p - 1, n - 1] >= s[p - 1, 0], fl[p - 1, n - 1], np.inf),
                         axis=None) == np.inf:
        return math.inf
    x = functools.reduce(np.minimum, [np.where(cp[..., r] >= s, fl[..., r], np.inf)
                                      for r in range(fl.shape[-1])])
    return minmax_bands(x, *send_floors)


def band_view(x: np.ndarray, p: int, n: int) -> np.ndarray:
    """[j, b', a', ...] = x[j + b', j + a', ...] for j < p, b', a' < n = L - p + 1: stage j's
    cells of a cut into p stages (`_band`: j <= a <= b <= L - p + j) at (b - j, a - j), as one
    read-only strided view (no copy); x: [L, L, ...]; a 1-D x gives [j, i] = x[j + i]."""
    st = x.strides
    shape, strides = ((p, n), (st[0], st[0])) if x.ndim == 1 else (
        (p, n, n) + x.shape[2:], (st[0] + st[1],) + st)
    if x.flags.c_contiguous:  # the buffer itself (as_strided's generic path is slower)
        out = np.ndarray(shape, x.dtype, buffer=x, strides=strides)
        out.flags.writeable = False
        return out
    return np.lib.stride_tricks.as_strided(x, shape, strides, writeable=False)


def minmax_bands(x_JBA: np.ndarray, send_fwd_L=None, send_bwd_L=None) -> float:
    """`nest.solver.positions.minmax_cells` on the full bands: x_JBA[j, b', a'] the cost of stage
    j of p = len(x_JBA) covering layers j + a' .. j + b' (`band_view`; a' > b' is no cell and
    must be inf, stage 0 starts at layer 0 and the last stage ends at layer L - 1), plus the
    forward send of its last layer (but the last stage's) and the backward send of its first
    (but the first's), added in that order as minmax_cells adds them. g[b'] = min over a' <= b'
    of max(cost[b', a'], g_prev[a']) stage by stage (stage j - 1 ends at j - 1 + a'); min and
    max are exact, so the same float as minmax_cells (tests/test_fast_bounds.py). A g all inf
    (checked at stages 1, 2, 4, 8, ...) makes the bound inf."""
    p, n = x_JBA.shape[:2]
    x = x_JBA
    if p > 1 and (send_fwd_L is not None or send_bwd_L is not None):
        x = x.copy()
        if send_fwd_L is not None:
            x[:-1] += band_view(np.ascontiguousarray(send_fwd_L), p, n)[:-1, :, None]
        if send_bwd_L is not None:
            x[1:] += band_view(np.ascontiguousarray(send_bwd_L), p, n)[1:, None, :]
    g, buf = x[0, :, 0], np.empty((n, n))
    for j in range(1, p - 1):
        if not j & (j - 1) and np.minimum.reduce(g) == np.inf:  # at j = 1, 2, 4, 8, ...
            return math.inf  # inf stays inf under max and min: every later g is all inf
        g = np.minimum.reduce(np.maximum(x[j], g, out=buf), axis=1)
    if p > 1:
        g = np.maximum(x[p - 1, n - 1], g).min(keepdims=True)
    return float(g[-1])


def compute_bounds(problem: Problem, space: SearchSpace, lts, max_pp: int):
    """X_lb[p] for every p from the floors alone (no memory): min over cuts into p stages of the
    largest stage floor (index 0 unused); and the floor table [b, a, r] (inf where a > b) for
    refinements. Kept in
    the problem's cache (one store per modes), by what they read of the space: whether its
    replicas are aligned blocks (`floor_LR`), not its ZeRO stages (searches per ZeRO stage
    share them)."""
    from nest.solver.dp import lower_bounds

    key = (tuple(lt.variant for lt in lts), replica_blocks_aligned(space), max_pp)
    idx = subset_of_all(lts[0].modes)
    if idx is not None and len(idx) == 1:  # one mode: the column of the per-mode bounds
        def column():
            full = [layer_table(problem, lt.variant, ALL_MODES) for lt in lts]
            lb_PR, table = per_mode_bounds(problem, space, full, max_pp)
            return read_only((np.ascontiguousarray(lb_PR[:, idx[0]]),
                              np.ascontiguousarray(table[..., idx])))

        return problem.cache.get(("compute_bounds", lts[0].modes), key, column)

    def make():
        floor = floor_LR(problem, lts, space)
        return read_only((lower_bounds(range_sum(floor.min(axis=1)), max_pp),
                          _floor_table(range_sum(floor))))

    return problem.cache.get(("compute_bounds", lts[0].modes), key, make)


def _floor_table(sums_LLR: np.ndarray) -> np.ndarray:
    """The floor table [b, a, r] of range sums, inf where a > b (no stage; `minmax_bands` needs
    it)."""
    L = sums_LLR.shape[0]
    return np.where(np.tri(L, dtype=bool)[..., None], sums_LLR, np.inf)


def per_mode_bounds(problem: Problem, space: SearchSpace, lts, max_pp: int):
    """`compute_bounds` of each mode of the tables `lts` alone, at once: X_lb[p, r] and the
    floor table [b, a, r]. Column r is what compute_bounds gives the tables of mode r alone (a
    table of some modes is the all-modes table's columns, and so are its floors; the range
    sums and the min-max DP run column by column: exact), so the searches of one mode each
    (nest.solver.launchable) share one computation. Kept in the problem's cache."""
    from nest.solver.dp import lower_bounds_per_column

    def make():
        sums = range_sum(floor_LR(problem, lts, space))
        return read_only((lower_bounds_per_column(sums, max_pp), _floor_table(sums)))

    key = (tuple(lt.variant for lt in lts), replica_blocks_aligned(space), max_pp)
    return problem.cache.get(("per_mode_bounds", lts[0].modes), key, make)


def joint_bound(problem: Problem, space: SearchSpace, lts, p: int, d: int,
                stop_at: float = math.inf) -> float:
    """`joint_minmax` less its relative slack of 1e-12 (the bound itself, below)."""
    return joint_minmax(problem, space, lts, p, d, stop_at) * (1 - 1e-12)


def joint_minmax(problem: Problem, space: SearchSpace, lts, p: int, d: int,
                 stop_at: float = math.inf, floors: dict | None = None,
                 record: dict | None = None) -> float:
    """A lower bound of one candidate that couples time, sync and memory per stage, from the
    stage kernel's exact prices. Relaxation: for a placement of the space, every stage position j
    has known devices, neighbours, stash and tied partner (nest.costs.pipeline), so for stage j covering
    a..b with variant v (of the class `lts`) and option o that fits in HBM, t_j and u_j are the
    kernel's exact values (nest.costs.stage.stage_cost); then
        T = C max_j t_j + max_j u_j >= max_j (C t_j + u_j),
    C = m + p - 1 for the paper's form, m for the tight form (pipeline_time: dapple,
    nest.solver.tight: sum t + (m - 1) max t + max u >= m max t + max u since every t >= 0). Minimised over each stage's variant and option, a
    min-max DP over the cuts (stage j covers a cell j <= a <= b <= L - p + j), and the least over
    the placements. Only the coupling of the two maxima is relaxed (exact for p = 1); a relative
    slack of 1e-12 absorbs rounding. It subsumes the weight-only bound (some stage holds 1/p of
    the weights: its sync and ZeRO collectives are terms of C t_j + u_j). With an overlapped
    gradient sync (dp_overlap stage | bucketed) the tail max(0, max_j (e_j - D_j)) replaces
    max_j u_j: it is at least 0 and at least stage 0's own e_0 (nothing drains before it), so
    u_0 = max(e_0, 0) and u_j = 0 for the other stages. Computed by nest.solver.positions
    (the same floats as pricing every cell with stage_cost); stop_at (the search's best time):
    where the bound reaches it, any value at or above it is returned (cells that cannot bring
    it below are not priced; inf when a position keeps no cell). This function returns the
    min-max before the slack: with stop_at s it is exact (B) where B < s, and at least B
    everywhere (dropping cells only raises a min-max), so nest.solver._joint can reuse it.

    floors: {placement: a lower bound of that placement's min-max} (nest.solver._union_floor's,
    from the union of the knob spaces): a placement whose floor reaches the stop it would be
    priced at (min(stop_at, the best so far)) is skipped, as pricing it would give a value at
    or above that stop: where the result is below stop_at it is the same float (the best so
    far is at most it), elsewhere it stays at or above stop_at and at least B. record: filled
    with {placement: (its min-max, or inf where a position keeps no cell; the stop it was
    priced at)}: the min-max is exact below that stop, and at or above it means B of the
    placement is too (a dropped cell's floor reaches the stop)."""
    v0, L = lts[0].variant, lts[0].num_layers
    m = problem.num_microbatches(d, v0.ep)
    C = bottleneck_weight(solver_form(problem.training), m, p)
    floor_LL = compute_floor(lts, C)
    bands = [_band(j, p, L) for j in range(p)]
    B_all, A_all, starts = _bands_flat(p, L)
    floor_all = floor_LL[B_all, A_all]  # every position's cells' floors, read once
    best = math.inf
    for placement in space.placements_for(v0, p, d):
        # a later placement matters only below the best so far: priced with stop_at at most
        # that, its value is exact where below it and at or above it elsewhere, so the minimum
        # is the same float
        stop = min(stop_at, best)
        if floors is not None and floors.get(placement, -math.inf) >= stop:
            continue  # its min-max reaches stop (the docstring's floors)
        cells = _kept_bands(bands, floor_all, starts, stop)
        if cells is None:  # a position with no cell below stop
            if record is not None:
                record[placement] = (math.inf, stop)
            continue
        ids = place(p, d, v0.width, placement, tp=v0.tp, cp=v0.cp, ep=v0.ep)
        rows = placement_rows(problem, lts, ids, d, space.options, C,
                              [stash(p, j, m) for j in range(p)], cells, stop)
        value = minmax_cells(rows, L)
        if record is not None:
            record[placement] = (value, stop)
        best = min(best, value)
    return best


def _kept_bands(bands, floor_all, starts, stop: float):
    """The cells (b, a) of every position's band whose floor is below stop (1 + DROP_SLACK),
    from the floors read in one gather; None if a position keeps none."""
    if math.isinf(stop):
        return [(b, a) for a, b in bands]
    keep = floor_all < stop * (1 + DROP_SLACK)
    if not np.logical_or.reduceat(keep, starts).all():
        return None
    ends = list(starts[1:]) + [len(keep)]
    return [(b[keep[s:e]], a[keep[s:e]]) for (a, b), s, e in zip(bands, starts, ends)]


@functools.lru_cache(maxsize=1024)
def _bands_flat(p: int, L: int):
    """(last layers, first layers, each position's start) of the bands of p stages
    (`_band`), concatenated position by position; read-only, cached."""
    bands = [_band(j, p, L) for j in range(p)]
    starts = np.cumsum([0] + [len(a) for a, _ in bands[:-1]])
    return (read_only(np.concatenate([b for _, b in bands])),
            read_only(np.concatenate([a for a, _ in bands])), read_only(starts))


@functools.lru_cache(maxsize=4096)
def _band(j: int, p: int, L: int) -> tuple[np.ndarray, np.ndarray]:
    """(first layers, last layers) of the cells stage j of p can cover: j <= a <= b <= L - p + j
    (every stage non-empty; the first starts at layer 0, the last ends at layer L - 1); read-only
    arrays, cached."""
    return tuple(read_only(x) for x in _band_cells(j, p, L))


def _band_cells(j: int, p: int, L: int) -> tuple[np.ndarray, np.ndarray]:
    if p == 1:
        return np.array([0]), np.array([L - 1])
    if j == 0:
        return np.zeros(L - p + 1, dtype=np.int64), np.arange(L - p + 1)
    if j == p - 1:
        return np.arange(p - 1, L), np.full(L - p + 1, L - 1)
    b, a = np.tril_indices(L - p + 1)
    return a + j, b + j


def _max_stash(problem: Problem, space: SearchSpace, lt: LayerTable, d: int) -> np.ndarray:
    """Micro-batches a stage a..b can stash with (z, r) and d replicas and still fit (-1: none),
    [b, a, z, r] (the kernel's memory model; cached per table and d)."""
    def make():
        fixed, step = fixed_and_step_bytes(problem, lt, d, Options(space.zero_stages, lt.modes))
        return read_only(stash_capacity(fixed, lt.act_LLR[:, :, None, :],
                                        problem.cluster.hardware, step))
    return problem.cache.get(lt.store, ("max_stash", d, space.zero_stages), make)
