"""Stage positions of a placement -> the joint bound's cost of every cell, and its min-max over cuts.

nest.solver.bounds.joint_bound states the relaxation; this module computes it fast and to the
bit. Legend: L layers (b: last, a: first), Z ZeRO stages, R recomputation modes; a position's
cells are parallel arrays (b, a) of its band (nest.solver.bounds._band).

Per position j and cell, with the stage kernel's terms (nest.costs.stage: the whole-grid terms
cached per group-terms content, the sends, the tied all-reduce, the memory model):
    cost[b, a] = min over (z, r) that fit of  C * t[z, r] + u[z],
    t[z, r] = (base[r] + per_mb[z]) + send,   u[z] = sync[z] + tied
(the kernel's own expressions, in its order of operations). For one z, C * ((y + per_mb[z]) +
send) + u[z] is non-decreasing in y under IEEE rounding (each operation is monotone), so the
minimum over the modes r that fit is that expression at y = min of base[r] over them: the same
float, for Z R -> Z evaluations. With the overlapped sync (dp_overlap stage | bucketed) the
term after t depends on r and the kernel's cells are used as they are (stage_cost, from_grid).

Cells that cannot matter (`stop_at`): every term is >= 0, so cost[b, a] >= C * min_r comp[b, a, r]
(the stage's compute, fl-monotone as above) before the position's group terms are known, and
cost[b, a] >= C * min_r base[b, a, r] + min_z sync[b, a, z] after. A cell whose floor reaches
`stop_at` (1 + 1e-11) lies in no cut whose maximum the bound (x (1 - 1e-12)) could leave below
stop_at, so it is dropped: where the bound is below stop_at it is unchanged, elsewhere it stays
at or above stop_at (inf when a position keeps no cell). The search passes its best time: a
candidate whose bound reaches it is never visited, whatever the bound's value.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from nest.costs.groups import placement_group_terms
from nest.costs.memory import peak
from nest.costs.cache import read_only
from nest.costs.pipeline import held_bytes, links, stash_capacity
from nest.costs.stage import grid_terms, stage_cost, tied_sync_s
from nest.network.collectives import pair_levels_rows, send_time

DROP_SLACK = 1e-11  # relative: a cell is dropped when its floor reaches stop_at (1 + this)


def compute_floor(lts, C: int) -> np.ndarray:
    """[b, a]: C times the least compute of layers a..b over the class's variants and modes, at
    most the cost of the cell at any position (module docstring)."""
    return np.min([C * lt.comp_LLR.min(axis=2) for lt in lts], axis=0)


def placement_rows(problem, lts, ids, d: int, opts, C: int, stash_J, cells,
                   stop_at: float = math.inf) -> list:
    """[(b, a, cost)] of every stage position j of a placement (devices ids[j], neighbours and
    tied partner from ids, stash_J[j] micro-batches stashed) at its cells (b, a), least over
    the class's variants (module docstring): all positions at once."""
    pos = np.concatenate([np.full(len(b), j) for j, (b, a) in enumerate(cells)])
    B = np.concatenate([b for b, a in cells])
    A = np.concatenate([a for b, a in cells])
    arr = np.asarray(ids, dtype=np.int64)  # [P, D]: converted once, for links and groups
    links_J = _links(problem.cluster, arr)
    cost = None
    for lt, gts in zip(lts, placement_group_terms(problem, lts, arr, d)):
        memo: dict = {}  # positions of one group-terms object share one grid_terms call
        terms = [memo[id(gt)] if id(gt) in memo else memo.setdefault(
            id(gt), grid_terms(problem, lt, gt, d, opts)) for gt in gts]
        if terms[0][6] is not None:  # overlapped sync: the kernel's cells, position by position
            x = np.concatenate([_overlap_cost(problem, lt, ids, j, d, opts, C, stash_J[j], b, a)
                                for j, (b, a) in enumerate(cells)])
        else:
            x = _fast_cost(problem, lt, gts, terms, ids, links_J, d, opts, C,
                           np.asarray(stash_J, dtype=float), pos, B, A, stop_at)
        cost = x if cost is None else np.minimum(cost, x)
    ends = np.cumsum([len(b) for b, a in cells])
    return [(b, a, c) for (b, a), c in zip(cells, np.split(cost, ends[:-1]))]


def _links(cluster, ids) -> list:
    """Per adjacent pair of positions (j, j + 1), the levels its transfers cross
    (nest.network.collectives.pair_levels_rows; stages of a placement have one size, so the
    backward transfer pairs the same devices and crosses the same levels)."""
    a = np.asarray(ids, dtype=np.int64)  # stages of one size: pairs are zipped
    return pair_levels_rows(cluster, a[:-1], a[1:]) if len(a) > 1 else []


def _overlap_cost(problem, lt, ids, j, d, opts, C, stash, b, a):
    c = stage_cost(problem, lt, ids[j], d, opts, stash, cell=(a, b), from_grid=True,
                   **links(ids, j))
    after = np.maximum(c.tail, 0.0) if j == 0 else 0.0  # nest.solver.bounds.joint_bound
    return np.where(c.mem <= problem.cluster.hardware.hbm_bytes, C * c.t + after,
                    np.inf).min(axis=(-2, -1))


def _fast_cost(problem, lt, gts, terms, ids, links_J, d: int, opts, C: int, stash_J, pos, B,
               A, stop_at: float):
    """min over (z, r) that fit of C t + u at the cells (pos: their positions), r minimised
    first (module docstring); every value the float stage_cost gives its position's cell, or
    inf where C min_r base + min_z sync (at most the cost: every other term is >= 0 and every
    operation monotone) reaches stop_at (1 + DROP_SLACK)."""
    p, L = len(ids), lt.num_layers
    assert stash_J.max() <= L  # fit_capacity's range
    R = len(opts.recompute_modes)
    out = np.full(len(B), np.inf)
    keep = slice(None)
    cell = B * L + A  # cells come position by position (pos is sorted): flat index b L + a
    groups = _alike(terms)
    if not math.isinf(stop_at):
        def floor_at(j, c):
            f = _floor_grids(problem, lt, gts[j], d, opts, terms[j])
            return C * f[0].ravel()[c] + f[1].ravel()[c]
        floor = _gather(_parts(groups, pos), cell, floor_at)
        keep = np.flatnonzero(floor < stop_at * (1 + DROP_SLACK))
        pos, cell = pos[keep], cell[keep]
    # each group of positions sharing grid terms reads its cells in one gather per array
    parts = _parts(groups, pos)
    base_R, per_mb_Z, sync_Z = (_gather(parts, cell, lambda j, c, k=k: np.take(
        terms[j][k].reshape(L * L, -1), c, axis=0)) for k in range(3))
    fit = _fit_by_mode(problem, lt, d, opts, terms[0])  # [r][b L + a, z]
    s = stash_J[pos][:, None]
    y = np.where(s <= np.take(fit[0], cell, axis=0), base_R[:, :1], np.inf)  # [cells, Z]: the
    for r in range(1, R):  # least base that fits
        y = np.minimum(y, np.where(s <= np.take(fit[r], cell, axis=0), base_R[:, r:r + 1],
                                   np.inf))
    # stage_cost's sends: 0.0 + forward send (not the last) + backward send (not the first)
    fwd, bwd = np.zeros((p, L)), np.zeros((p, L))
    prev_out = np.concatenate([[0.0], lt.out_L[:-1]])
    sends: dict = {}  # per levels crossed (all _send reads of the pair): read once each
    for j, lv in enumerate(links_J):
        if lv not in sends:
            sends[lv] = (_send(problem, lt, ids[j], ids[j + 1], lv, "fwd", lt.out_L),
                         _send(problem, lt, ids[j + 1], ids[j], lv, "bwd", prev_out))
        fwd[j], bwd[j + 1] = sends[lv]
    send = (0.0 + fwd[pos, cell // L]) + bwd[pos, cell % L]
    tied = np.zeros(p)  # the first and the last stage all-reduce over the same device pairs
    tied[0] = tied[-1] = tied_sync_s(problem, lt, ids[0], links(ids, 0)["tied_partner"])
    x = C * ((y + per_mb_Z) + send[:, None]) + (sync_Z + tied[pos][:, None])
    out[keep] = functools.reduce(np.minimum, x.T)
    return out


def _alike(terms) -> list:
    """The positions grouped by their grid terms object (grid_terms keeps one per group-terms
    content; most placements price every position alike): [(first position, positions)]."""
    groups: dict = {}
    for j, t in enumerate(terms):
        groups.setdefault(id(t), (j, []))[1].append(j)
    return list(groups.values())


def _parts(groups, pos) -> list:
    """[(j, idx)] for each group of `_alike` (j its first position): idx the indices of the
    cells whose position is in the group, ascending (np.flatnonzero(np.isin(pos, group)), for
    every group from one stable sort of the cells' group numbers instead of one isin each)."""
    if len(groups) == 1:
        return [(groups[0][0], None)]
    num = np.empty(max(k for _, js in groups for k in js) + 1, dtype=np.int64)
    for g, (_, js) in enumerate(groups):
        num[js] = g
    of = num[pos]
    order = np.argsort(of, kind="stable")  # within a group, the cells' own (ascending) order
    ends = np.cumsum(np.bincount(of, minlength=len(groups)))
    return [(j, order[e - n:e]) for (j, _), e, n in
            zip(groups, ends.tolist(), np.diff(ends, prepend=0).tolist())]


def _gather(parts, cell, read):
    """read(j, cells) for each group of `_parts` (j its first position) at the cells of its
    positions, in the cells' order: element by element what each position's own read gives
    (its group shares the arrays read), in one read per group instead of one per position."""
    if len(parts) == 1:
        return read(parts[0][0], cell)
    out = None
    for j, idx in parts:
        x = read(j, cell[idx])
        if out is None:
            out = np.empty((len(cell), *x.shape[1:]), dtype=x.dtype)
        out[idx] = x
    return out


def _floor_grids(problem, lt, gt, d: int, opts, terms):
    """[b, a] grids of a position's least base time over the modes and least sync over the ZeRO
    stages (exact minima), cached with its grid terms: C base + sync <= its cost."""
    def make():
        base_R, _, sync_Z = terms[:3]
        return read_only((functools.reduce(np.minimum, np.moveaxis(base_R, -1, 0)),
                          functools.reduce(np.minimum, np.moveaxis(sync_Z, -1, 0))))
    return problem.cache.get(lt.store, ("grid_floor", d, gt.content, opts), make)


def _send(problem, lt, src, dst, levels, direction: str, nbytes_L):
    """send_time of every layer's boundary tensor from src to dst, whose pairs cross `levels`
    (send_time's only dependence on the devices), cached per those levels."""
    return problem.cache.get(lt.store, ("send", direction, levels), lambda: read_only(
        send_time(problem.cluster, src, dst, nbytes_L)))


def fit_capacity(problem, lt, d: int, opts, terms) -> np.ndarray:
    """[b, a, z, r]: the most micro-batches (0..L) a stage of layers a..b can stash with (z, r)
    and fit, exactly as the kernel decides it: stash s fits iff peak(held_bytes) <= HBM
    (nest.costs.stage.stage_cost), non-decreasing in s (act >= 0, and every IEEE operation of
    held_bytes and peak is monotone), so the stashes that fit are 0..capacity. Found from
    nest.costs.pipeline.stash_capacity's estimate and moved until the kernel's own test holds
    at the capacity and fails one above it; position-free (terms: any position's grid terms
    for d and opts), cached per (d, options)."""
    fixed_ZR, act_R, step_Z = terms[3], terms[4][..., None, :], terms[7]
    hw, smax = problem.cluster.hardware, lt.num_layers
    valid = np.tril(np.ones((smax, smax), dtype=bool))[..., None, None]  # a <= b (else: 0)
    assert (act_R >= 0)[np.broadcast_to(valid, act_R.shape)].all()

    def fits(s):
        return valid & (peak(held_bytes(fixed_ZR, s, act_R, step_Z), hw) <= hw.hbm_bytes)

    def make():
        est = np.nan_to_num(stash_capacity(fixed_ZR, act_R, hw, step_Z), posinf=smax,
                            neginf=0)
        cap = np.where(valid, np.clip(est, 0, smax), 0)
        while True:
            up = (cap < smax) & fits(cap + 1)
            down = (cap >= 1) & ~fits(cap)
            if not (up.any() or down.any()):
                return read_only(cap.astype(np.int16))
            cap = cap + up - down

    return problem.cache.get(lt.store, ("fit_capacity", d, opts), make)


def _fit_by_mode(problem, lt, d: int, opts, terms) -> tuple:
    """`fit_capacity` as one [b L + a, z] array per recomputation mode (contiguous rows to
    gather), in the smallest unsigned type that holds 0..L; cached beside it."""
    def make():
        cap = fit_capacity(problem, lt, d, opts, terms)
        L, Z, R = cap.shape[1:]
        small = cap.astype(np.uint8 if L <= 255 else np.uint16)
        return read_only(tuple(np.ascontiguousarray(small[..., r].reshape(L * L, Z))
                               for r in range(R)))
    return problem.cache.get(lt.store, ("fit_by_mode", d, opts), make)


def minmax_cells(rows, L: int, send_fwd_L=None, send_bwd_L=None) -> float:
    """min over cuts of layers 0..L-1 into p = len(rows) stages of max_j cost_j (+ the forward
    send of the stage's last layer b, except the last stage, + the backward send of its first
    layer a, except the first), rows[j] = (b, a, cost) of the cells stage j may cover (any
    other cell: inf; stage 0's cells start at layer 0, the last stage's end at layer L - 1):
    f[b] = min over a of max(cost[b, a], f_prev[a - 1]) stage by stage, on the listed cells
    only. A cut's stages are non-empty, so a cell off stage j's band (nest.solver.bounds._band)
    is in no cut, and min and max are exact: the same float as the DP over every stage's full
    [b, a] grid (tests/test_fast_bounds.py)."""
    f, p = None, len(rows)
    for j, (b, a, c) in enumerate(rows):
        if send_fwd_L is not None and j < p - 1:
            c = c + send_fwd_L[b]
        if send_bwd_L is not None and j > 0:
            c = c + send_bwd_L[a]
        if f is not None:  # prev[a] = the best of the stages before, ending at layer a - 1
            c = np.maximum(c, np.concatenate([[np.inf], f[:-1]])[a])
        f = np.full(L, np.inf)
        np.minimum.at(f, b, c)
    return float(f[L - 1])
