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

import math

import numpy as np

from nest.costs.groups import GROUP_CACHE_ENTRIES, SYNC_KINDS, dp_lines, group_terms, inner_groups
from nest.costs.layers import LayerTable, range_sum
from nest.costs.memory import allocatable, optimizer_step_for, state_bytes
from nest.costs.stage import Options, bytes_per_param, fixed_bytes, zero_schedule
from nest.graph.layer_graph import Variant
from nest.network.collectives import group_lines_by_kind, lines_time, path_bandwidth
from nest.plan import place
from nest.problem import Problem
from nest.space import SearchSpace

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
    Without aligned replicas: 0 (no floor)."""
    v, L = lt.variant, lt.num_layers
    out = np.zeros((L, len(lt.modes)))
    if v.width == 1 or not replica_blocks_aligned(space):
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
    prices the transfer (no monotonicity of levels assumed)."""
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
    need more memory) and the most favourable ZeRO stage; a min-max DP over the cuts."""
    v, L = lts[0].variant, lts[0].num_layers
    d = largest_dp(problem, v, p)
    m = problem.num_microbatches(d, v.ep)
    # the most any variant of the class can stash, per mode, under its best ZeRO stage
    max_stash_LLR = np.max([_max_stash(problem, space, lt, d).max(axis=2) for lt in lts], axis=0)
    return minmax_over_cuts(
        lambda j: np.where(max_stash_LLR >= min(p - j, m), floor_LLR, np.inf).min(axis=2),
        p, L, *send_floors)


def weight_bound(problem: Problem, space: SearchSpace, lts, p: int, d: int) -> float:
    """A lower bound from the weights alone. Relaxation: some stage k holds at least 1/p of the
    dense parameters (and some stage, maybe another, 1/p of the expert ones); T >= (m + p - 1)
    t_k + u_k >= (m + p - 1) * its per-micro-batch ZeRO collectives + its sync + its optimizer
    step, all non-decreasing in its bytes, priced with k's ZeRO stage on k's data-parallel groups,
    a ZeRO stage being possible only if the weights, gradients and optimizer states it leaves on
    the device (also non-decreasing in the bytes) fit in HBM on their own;
    k, its ZeRO stage, its variant (of the class `lts`) and the placement are unknown, so the
    minimum over all of them."""
    return max(min(_weight_bound(problem, space, lt, p, d)[part] for lt in lts)
               for part in ("dense", "expert"))


def _weight_bound(problem: Problem, space: SearchSpace, lt: LayerTable, p: int, d: int) -> dict:
    v, tr, hw = lt.variant, problem.training, problem.cluster.hardware
    m = problem.num_microbatches(d, v.ep)
    room = allocatable(hw) * (1 + 1e-9)  # slack keeps the bound valid
    total_dense = lt.pd_LL[-1, 0] if p == 1 else lt.dense_L.sum()
    best = {"dense": math.inf, "expert": math.inf}
    shares = {"dense": (total_dense / p, 0.0), "expert": (0.0, lt.expert_L.sum() / p)}
    for placement in space.placements_for(v, p, d):
        ids = place(p, d, v.width, placement, tp=v.tp, cp=v.cp, ep=v.ep)
        seen = set()
        for j in range(p):
            lines, _ = dp_lines(problem, lt, ids[j], d)
            if id(lines) in seen:
                continue
            seen.add(id(lines))
            for part, (pd, pe) in shares.items():
                if not pd and not pe:
                    best[part] = 0.0
                    continue

                def coll(kind: str, which: str, pd=pd, pe=pe, lines=lines):
                    n = bytes_per_param(tr, which)
                    return float(lines_time(lines["dense"][kind], n * pd)
                                 + lines_time(lines["expert"][kind], n * pe))

                for z in space.zero_stages:
                    if sum(state_bytes(pd, pe, d, v.ep, v.cp, z, tr).values()) > room:
                        continue  # its states alone overflow: z is not an option for stage k
                    per_mb, sync = zero_schedule(z, coll)
                    x = ((m + p - 1) * sum(per_mb.values()) + sum(sync.values())
                         + optimizer_step_for(pd, pe, d, v.ep, v.cp, z, tr, hw))
                    best[part] = min(best[part], x)
    return best


def compute_bounds(problem: Problem, space: SearchSpace, lts, max_pp: int):
    """X_lb[p] for every p from the floors alone (no memory): min over cuts into p stages of the
    largest stage floor (index 0 unused); and the floor table [b, a, r] for refinements."""
    from nest.solver.dp import lower_bounds

    floor = floor_LR(problem, lts, space)
    return lower_bounds(range_sum(floor.min(axis=1)), max_pp), range_sum(floor)


def joint_bound(problem: Problem, space: SearchSpace, lts, p: int, d: int,
                floor_LLR: np.ndarray, send_floors) -> float:
    """A lower bound of one candidate that couples time, sync and memory per stage.
    Relaxation: T = (m + p - 1) max_j t_j + max_j u_j >= max_j [(m + p - 1) t_j + u_j], and for
    stage j covering a..b with ZeRO stage z and mode r (which must fit at position j with this
    candidate's d and stash min(p - j, m): the kernel's memory model, exact),
        (m + p - 1) t_j + u_j >= (m + p - 1) (floor[a..b, r] + sends + ZeRO per micro-batch[z])
                                 + sync[z] + optimizer step[z],
    the collectives priced at the fastest algorithm of the fastest data-parallel group that any
    stage position of any placement has (each stage's slowest group is at least that). Then the
    least over (z, r) that fit, and a min-max DP over the cuts. Every stage may pick any variant
    of the class `lts`."""
    v0, L = lts[0].variant, lts[0].num_layers
    tr, hw = problem.training, problem.cluster.hardware
    m = problem.num_microbatches(d, v0.ep)
    C = m + p - 1
    send_fwd_L, send_bwd_L = send_floors
    cost_J = [np.full((L, L), np.inf) for _ in range(p)]
    for lt in lts:
        v = lt.variant
        max_stash = _max_stash(problem, space, lt, d)  # [b, a, z, r]
        pd, pe = lt.pd_LL, lt.pe_LL
        union: dict = {}  # every line of every dp group of every stage position and placement
        for placement in space.placements_for(v, p, d):
            ids = np.array(place(p, d, v.width, placement, tp=v.tp, cp=v.cp, ep=v.ep))
            for part in ("dense", "expert"):
                groups = np.concatenate([inner_groups(row, v.tp, v.cp, v.ep, d)["dp_" + part]
                                         for row in ids])
                for kind, lines in group_lines_by_kind(problem.cluster, SYNC_KINDS,
                                                       groups).items():
                    union.setdefault((part, kind), set()).update(ln for g in lines for ln in g)
        fastest = {k: [tuple(sorted(x))] if x else [] for k, x in union.items()}

        def coll(kind: str, which: str, fastest=fastest, pd=pd, pe=pe):
            n = bytes_per_param(tr, which)
            return (lines_time(fastest.get(("dense", kind), []), n * pd)
                    + lines_time(fastest.get(("expert", kind), []), n * pe))

        per_z = []
        for z in space.zero_stages:
            per_mb, sync = zero_schedule(z, coll)
            per_z.append(C * sum(per_mb.values(), np.zeros((L, L))) + sum(sync.values(), 0.0)
                         + optimizer_step_for(pd, pe, d, v.ep, v.cp, z, tr, hw))
        zc_LLZ = np.stack(per_z, axis=-1)
        base_LLZR = C * floor_LLR[:, :, None, :] + zc_LLZ[..., None]
        by_stash: dict = {}
        for j in range(p):
            s = min(p - j, m)
            if s not in by_stash:
                by_stash[s] = np.where(max_stash >= s, base_LLZR, np.inf).min(axis=(2, 3))
            cost_J[j] = np.minimum(cost_J[j], by_stash[s])
    return minmax_over_cuts(lambda j: cost_J[j], p, L, C * send_fwd_L, C * send_bwd_L)


def minmax_over_cuts(cost_of, p: int, L: int, send_fwd_L, send_bwd_L) -> float:
    """min over cuts of layers 0..L-1 into p contiguous stages of max_j cost_j[b, a] (+ the
    forward send of the stage's last layer b, except the last stage, + the backward send of its
    first layer a, except the first), cost_of(j) giving stage j's [b, a] costs (a > b ignored)."""
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


def _max_stash(problem: Problem, space: SearchSpace, lt: LayerTable, d: int) -> np.ndarray:
    """Micro-batches a stage a..b can stash with (z, r) and d replicas and still fit (-1: none),
    [b, a, z, r] (the kernel's memory model; cached per table and d)."""
    key = ("max_stash", d, space.zero_stages)
    hit = lt.group_cache.get(key)
    if hit is not None:
        return hit
    room = allocatable(problem.cluster.hardware) * (1 + 1e-9) - fixed_bytes(
        problem, lt, d, Options(space.zero_stages, lt.modes))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        n = np.floor(room / lt.act_LLR[:, :, None, :])
    out = np.where(room >= 0, np.where(np.isnan(n), np.inf, n), -1)
    lt.group_cache[key] = out
    if len(lt.group_cache) > GROUP_CACHE_ENTRIES:
        lt.group_cache.popitem(last=False)
    return out
