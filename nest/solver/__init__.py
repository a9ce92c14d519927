"""The NEST solver: an exact, network- and memory-aware dynamic program (JAX) over the plan space.

Search space (nest.space, declared once; with settings {mbs_options: [1, 2, 4, 8]} also the
micro-batch size, one DP per size): the sub-graph variant (tp, sp, ep, cp) shared by all
stages; the number of stages p; the data-parallel degree d with p * d * tp*ep*cp <= N (devices may
stay idle; m = ceil(global_batch / (mbs * d * ep)) micro-batches); contiguous cuts anywhere
between layers (uneven stages); per stage a ZeRO stage and a recomputation mode; the placement of
stages and replicas on the hierarchy (replica-major or stage-major, nest.plan.place).

Objective: exactly the shared evaluator's time per batch,
    T = (m + p - 1) * max_j t_j + max_j u_j,
t_j the stage's time per micro-batch, u_j its gradient sync + optimizer step: the evaluator under
the default training settings (pipeline_time: paper, dp_overlap: none). Under the other settings
the evaluator prices a plan at most this (tighter schedule forms, overlapped sync), so the plan
found is the optimum of this upper bound, re-scored; the summary's schedule check reports how far
the two are apart on the figures' plans. Network awareness:
for a fixed (variant, p, d, placement) every stage position j has known devices, so every
collective and every pipeline transfer is priced at the level it actually crosses (the paper's
"deferred forward cost" over levels is replaced by fixing the placement per DP: the transfer of
stage j depends on the device pair (j, j+1), known exactly).

Exactness with two maxima: the optimum lies on the Pareto frontier of (max t, max u). The solver
walks that frontier with two bottleneck DPs (nest.solver.dp): X_k = min max t s.t. u <= cap,
U_k = min max u s.t. t <= X_k, then cap = just below U_k; every frontier point is visited and
T = C X + U is minimised over them (epsilon-constraint method, Haimes et al. 1971).

Speed: (variant, p, d) triples are visited in order of a lower bound (m + p - 1) * X_lb(p), X_lb
from a compute-only DP, and the search stops when the bound reaches the best time found (branch and
bound: exact, since the bound never exceeds the true time).
"""

from __future__ import annotations

import heapq
import math
import time

import numpy as np

from nest.evaluate import Problem, per_device, with_mbs
from nest.graph.layer_graph import Variant
from nest.solver.arrays import (StageArrays, range_sum, fixed_memory, layer_arrays,
                                stage_arrays)
from nest.solver.dp import bottleneck, lower_bounds
from nest.space import SearchSpace, declare, make_plan, pp_dp_options


def solve_fixed(arr: StageArrays, C: float, best_T: float):
    """Exact min of C * max t + max u for one (variant, p, d, placement); (T, stages) or None."""
    R = arr.t_JLLO.shape[-1] // arr.u_JLLZ.shape[-1]
    u = np.repeat(arr.u_JLLZ, R, axis=-1)  # option o = z * R + r
    t, ok = arr.t_JLLO, arr.ok_JLLO
    cap, best = math.inf, None
    while True:
        X, _ = bottleneck(t, u, ok, cap)
        if not math.isfinite(X) or C * X >= best_T:
            break
        U, _ = bottleneck(u, t, ok, X)
        if C * X + U < best_T:
            best_T, best = C * X + U, (X, U)
        cap = float(np.nextafter(U, -np.inf))
    if best is None:
        return None
    X, stages = bottleneck(t, u, ok, best[1])
    assert X == best[0]
    return best_T, stages


def search(problem: Problem, space: SearchSpace, log=None):
    """The optimum plan of the space and statistics; None if nothing fits.

    Candidates (variant, p, d) are popped from a heap by lower bound: first the compute-only bound
    (one DP for all p), refined on first pop by the memory-aware bound of (variant, p)."""
    best_T, best = math.inf, None
    heap: list = []
    las, refined, floors = {}, {}, {}
    for vi, v in enumerate(space.variants):
        la = layer_arrays(problem, v, space.recompute_modes)
        las[vi] = la
        options = list(pp_dp_options(problem, space, v))
        if not options:
            continue
        floor = floor_LR(problem, la, v, space.recompute_modes)
        floors[vi] = range_sum(floor)  # [b, a, r]
        lb = lower_bounds(range_sum(floor.min(axis=1)), max(p for p, _ in options))
        for p, d in options:
            m = problem.num_microbatches(d, v.ep)
            heap.append(((m + p - 1) * lb[p], False, vi, p, d))
    num_candidates = len(heap)
    heapq.heapify(heap)
    visited = 0
    while heap and heap[0][0] < best_T:
        bound, is_refined, vi, p, d = heapq.heappop(heap)
        v = space.variants[vi]
        if not is_refined:
            if (vi, p) not in refined:
                refined[(vi, p)] = memory_aware_bounds(problem, space, las[vi], v, p,
                                                       floors[vi])
            m = problem.num_microbatches(d, v.ep)
            bound = max((m + p - 1) * refined[(vi, p)],
                        weight_bound(problem, space, las[vi], v, p, d, m))
            heapq.heappush(heap, (bound, True, vi, p, d))
            continue
        for placement in space.placements:
            arr = stage_arrays(problem, space, las[vi], v, p, d, placement)
            visited += 1
            res = solve_fixed(arr, arr.num_microbatches + p - 1, best_T)
            if res is not None and res[0] < best_T:
                best_T, best = res[0], (v, p, d, placement, res[1])
                if log:
                    log(f"  better: T={best_T:.6g} s  {v.key} p={p} d={d} {placement}")
    stats = {"candidates": num_candidates, "visited": visited}
    return best_T, best, stats


def floor_LR(problem: Problem, la, v: Variant, modes) -> np.ndarray:
    """Per layer and recomputation mode, a floor on its time per micro-batch in any stage:
    compute plus the variant's collectives on the best-placed groups (one replica at device 0:
    every group is as low in the hierarchy as its size allows, and collective time only grows
    with the level a group spans)."""
    from nest.evaluate import inner_groups, worst

    groups = inner_groups(tuple(range(v.width)), v.tp, v.cp, v.ep, 1)
    full = [i for i, r in enumerate(modes) if r == "full"]
    out = la.comp_LR.copy()
    rows: dict[int, np.ndarray] = {}
    for li, c in enumerate(la.costs):
        if id(c) not in rows:
            row = np.zeros(len(modes))
            for col in c.collectives:
                x = worst(problem.cluster, col.kind, groups[col.group], col.bytes) * col.count
                row += x
                if col.phase == "fwd":
                    row[full] += x
            rows[id(c)] = row
        out[li] += rows[id(c)]
    return out


def weight_bound(problem: Problem, space: SearchSpace, la, v: Variant, p: int, d: int,
                 m: int) -> float:
    """A lower bound from the weights alone: some stage holds at least 1/p of the parameters,
    and with its ZeRO stage z it pays (m + p - 1) times its per-micro-batch ZeRO collectives
    (they sit in its t_j) plus its gradient sync and optimizer step (its u_j), all increasing in
    the bytes; its data-parallel groups span at least the level that d * width devices need
    (one replica block at device 0 is the best placement)."""
    from nest.evaluate import inner_groups
    from nest.network.collectives import collective_time

    tr, hw, cl = problem.training, problem.cluster.hardware, problem.cluster
    wb, gb = tr.weight_bytes_per_param, tr.grad_bytes_per_param
    tied = (problem.model.vocab_size * problem.model.hidden_size / v.tp
            if problem.graph.tied_embeddings else 0.0)
    pd = (la.dense_L.sum() - tied) / p  # per device: the largest stage holds at least this
    pe = la.expert_L.sum() / p
    groups = inner_groups(tuple(range(d * v.width)), v.tp, v.cp, v.ep, d)
    dg, eg = groups["dp_dense"][0], groups["dp_expert"][0]

    def coll(kind: str, bpp: float) -> float:
        return collective_time(cl, kind, dg, bpp * pd) + collective_time(cl, kind, eg, bpp * pe)

    best = math.inf
    for z in space.zero_stages:
        params = per_device(pd, pe, d, v.ep, v.cp, z >= 1)
        opt = tr.optimizer_step_bytes * params / (hw.hbm_bytes_per_s * hw.memory_efficiency)
        per_mb = (coll("reduce_scatter", gb) if z >= 2 else 0.0) + (
            2 * coll("all_gather", wb) if z == 3 else 0.0)
        sync = {0: coll("all_reduce", gb),
                1: coll("reduce_scatter", gb) + coll("all_gather", wb),
                2: coll("all_gather", wb), 3: 0.0}[z]
        best = min(best, (m + p - 1) * per_mb + sync + opt)
    return best


def p2p_floor(problem: Problem, la, v: Variant) -> tuple[np.ndarray, np.ndarray]:
    """Floors on a stage's pipeline sends, per boundary layer: consecutive stages' devices are at
    least `width` ids apart (stage-major; replica-major puts them d * width apart), so they meet
    at level(0, width) or above; the cheapest such level prices the transfer."""
    from nest.network.collectives import path_bandwidth

    cl = problem.cluster
    lvl0 = cl.level_of(0, v.width) if v.width < cl.max_devices else len(cl.levels) - 1
    levels = range(max(lvl0, 0), len(cl.levels))

    def floor(nbytes: np.ndarray) -> np.ndarray:
        t = np.min([nbytes / path_bandwidth(cl, lv) + cl.levels[lv].latency_s for lv in levels],
                   axis=0)
        return np.where(nbytes > 0, t, 0.0)

    return floor(la.out_L), floor(np.concatenate([[0.0], la.out_L[:-1]]))


def memory_aware_bounds(problem: Problem, space: SearchSpace, la, v: Variant, p: int,
                        floor_LLR: np.ndarray) -> float:
    """X_lb(p): a lower bound on the bottleneck stage time of any plan with p stages and any d.
    Stage j's time is at least its floor (compute + best-placed collectives, `floor_LR`, + the
    floors of its sends, `p2p_floor`) with the cheapest recomputation mode that fits at its
    position under the most favourable d (the most replicas: the most ZeRO sharding and the
    fewest micro-batches to stash) -- fewer replicas only need more memory."""
    hw = problem.cluster.hardware
    N, L = problem.num_devices, la.comp_LR.shape[0]
    valid = np.tril(np.ones((L, L), dtype=bool))[..., None]
    # alloc * (1 + frag) + overhead <= HBM  <=>  alloc <= cap (slack keeps the bound valid)
    cap = (hw.hbm_bytes - hw.memory_overhead_bytes) / (1 + hw.memory_fragmentation) * (1 + 1e-9)
    d = max(1, min(N // (p * v.width),
                   problem.training.global_batch // (problem.mbs * v.ep)))  # the largest d
    m = problem.num_microbatches(d, v.ep)
    room = cap - fixed_memory(problem, la, v, d, space.zero_stages).min(axis=2)
    with np.errstate(divide="ignore", over="ignore"):
        max_stash_LLR = np.where(valid & (room >= 0), np.floor(room / la.act_LLR), -1)
    send_fwd_L, send_bwd_L = p2p_floor(problem, la, v)
    f = None
    for j in range(p):
        cost = np.where(max_stash_LLR >= min(p - j, m), floor_LLR, np.inf).min(axis=2)
        if j < p - 1:
            cost = cost + send_fwd_L[:, None]  # [b]: the stage's last layer's output
        if j > 0:
            cost = cost + send_bwd_L[None, :]  # [a]: the gradient of layer a-1's output
        if f is None:
            f = cost[:, 0].copy()
        else:
            prev = np.concatenate([[np.inf], f[:-1]])
            f = np.min(np.maximum(cost, prev[None, :]), axis=1)
    return float(f[L - 1])


def plan(problem: Problem, settings: dict):
    from nest.planners import NoPlan

    space = declare(problem, settings.get("space"))
    t0 = time.perf_counter()
    best_T, best, stats = search(problem, space)
    for mbs in settings.get("mbs_options") or ():  # search the micro-batch size when asked
        other = with_mbs(problem, int(mbs))
        T, found, st = search(other, declare(other, settings.get("space")))
        stats = {k: stats[k] + st[k] for k in stats}
        if found is not None and T < best_T:
            best_T, best, problem, space = T, found, other, declare(other, settings.get("space"))
    if best is None:
        raise NoPlan(infeasibility_reason(problem, space))
    v, p, d, placement, stages = best
    R = len(space.recompute_modes)
    cuts = [(a, b) for a, b, _ in stages]
    zero = [space.zero_stages[o // R] for _, _, o in stages]
    rec = [space.recompute_modes[o % R] for _, _, o in stages]
    out = make_plan(problem, "nest", v, p, d, cuts, zero, rec, placement)
    return out.with_(predicted_time_per_batch_s=best_T, solve_time_s=time.perf_counter() - t0,
                     notes=f"visited {stats['visited']} of {stats['candidates']} (variant, p, d)"
                           f" candidates x placements")


def infeasibility_reason(problem: Problem, space: SearchSpace) -> str:
    """Name the layer that fits nowhere and the least memory it would need: the layer alone on a
    stage at the pipeline's end (one micro-batch stashed), ZeRO-3 over the most replicas, full
    recomputation, the best variant (the same memory formula as the evaluator)."""
    hw, tr = problem.cluster.hardware, problem.training
    need = None
    for v in space.variants:
        if v.width > problem.num_devices:
            continue
        d = problem.num_devices // v.width
        la = layer_arrays(problem, v, ("full",))
        states = (tr.weight_bytes_per_param + tr.grad_bytes_per_param
                  + tr.optimizer_state_bytes) * (la.dense_L / (d * v.ep * v.cp)
                                                 + la.expert_L / (d * v.cp))
        gathered = tr.weight_bytes_per_param * (la.dense_L + la.expert_L)
        alloc = states + la.act_LR[:, 0] + la.work_LR[:, 0] + gathered
        mem = alloc * (1 + hw.memory_fragmentation) + hw.memory_overhead_bytes
        need = mem if need is None else np.minimum(need, mem)
    if need is None:
        return f"every variant needs more than the {problem.num_devices} devices"
    i = int(np.argmax(need))
    return (f"no plan fits in {hw.hbm_bytes / 1e9:.2f} GB per device even with ZeRO-3 and full "
            f"recomputation: layer {i} ({problem.graph.layers[i].name}) alone needs at least "
            f"{need[i] / 1e9:.2f} GB")
