"""Problem x (variant, p, d, placement) -> stage cost arrays over every cut and memory knob.

The vectorised twin of nest.evaluate._stage: for stage position j and a stage covering layers
a..b with ZeRO stage z and recomputation r, the same formulas give
    t[j, b, a, o]    time per micro-batch (compute, recompute, collectives, ZeRO, p2p)
    u[j, b, a, z]    time after the flush: gradient sync + optimizer step
    ok[j, b, a, o]   a <= b and the stage's peak memory fits in HBM
with o = z_index * R + r_index over the search space's ZeRO stages and recomputation modes.
Array legend: J stage positions, L layers (b: last layer, a: first layer), O options, Z ZeRO
stages, R recomputation modes. Reductions run over the last axes (fast on CPU).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from nest.evaluate import Problem, inner_groups, per_device, worst
from nest.graph.layer_graph import Variant
from nest.network.collectives import (coefficients, collective_time, distinct, path_bandwidth,
                                      shifted)
from nest.plan import place
from nest.space import SearchSpace


@dataclass
class LayerArrays:
    """Per-layer vectors of one variant (L layers, R recompute modes) and their range sums."""

    comp_LR: np.ndarray  # forward + backward + recomputed forward, seconds
    act_LR: np.ndarray  # bytes saved for backward per micro-batch
    work_LR: np.ndarray  # act(none) - act(r): working set of a recomputed layer
    dense_L: np.ndarray
    expert_L: np.ndarray
    out_L: np.ndarray  # boundary activation bytes
    costs: list  # LayerCost per layer
    # range sums / maxima over a stage covering layers a..b, indexed [b, a]
    pd_LL: np.ndarray = None
    pe_LL: np.ndarray = None
    comp_LLR: np.ndarray = None
    act_LLR: np.ndarray = None
    work_LLR: np.ndarray = None
    maxpar_LL: np.ndarray = None
    group_cache: OrderedDict = field(default_factory=OrderedDict)  # see stage_arrays


GROUP_CACHE_ENTRIES = 256  # each holds O(L^2) floats; bounded so memory stays small


def layer_arrays(problem: Problem, v: Variant, modes: tuple[str, ...]) -> LayerArrays:
    problem.ensure_variant(v)
    g = problem.graph
    costs = [la.costs[v.key] for la in g.layers]
    times = [problem.costs.times(i, v.key) for i in range(g.num_layers)]
    comp = np.array([[t.fwd_s + t.bwd_s + t.recompute_s[r] for r in modes] for t in times])
    act = np.array([[c.act_bytes[r] for r in modes] for c in costs])
    work = np.array([[c.act_bytes["none"] - c.act_bytes[r] for r in modes] for c in costs])
    la = LayerArrays(comp, act, work, np.array([c.dense_params for c in costs]),
                     np.array([c.expert_params for c in costs]),
                     np.array([c.output_bytes for c in costs]), costs)
    L = g.num_layers
    la.pd_LL = range_sum(la.dense_L)
    la.pe_LL = range_sum(la.expert_L)
    if g.tied_embeddings:  # one stage holding embedding and head keeps one copy
        la.pd_LL[L - 1, 0] -= problem.model.vocab_size * problem.model.hidden_size / v.tp
    la.comp_LLR = range_sum(comp)
    la.act_LLR = range_sum(act)
    la.work_LLR = range_max(work)
    la.maxpar_LL = range_max(la.dense_L + la.expert_L)
    return la


def range_sum(x_L: np.ndarray) -> np.ndarray:
    """S[b, a] = sum x[a..b] (valid for a <= b)."""
    c = np.concatenate([np.zeros((1,) + x_L.shape[1:]), np.cumsum(x_L, axis=0)])
    return c[1:, None] - c[None, :-1]


def range_max(x_L: np.ndarray) -> np.ndarray:
    """M[b, a] = max x[a..b] (valid for a <= b); x may carry trailing axes."""
    n = x_L.shape[0]
    out = np.zeros((n, n) + x_L.shape[1:])  # a > b cells are masked later; values >= 0
    for a in range(n):
        out[a:, a] = np.maximum.accumulate(x_L[a:], axis=0)
    return out


def _coll_array(problem: Problem, kind: str, groups, nbytes: np.ndarray) -> np.ndarray:
    """Vectorised `worst` over distinct groups: slowest group's min over algorithm lines,
    0 where nbytes <= 0."""
    cl = problem.cluster
    if len(groups) == 0 or len(groups[0]) <= 1:
        return np.zeros_like(nbytes)
    out = np.zeros_like(nbytes)
    for grp in groups:
        lines = coefficients(cl, kind, grp)
        out = np.maximum(out, np.min([a + b * nbytes for a, b in lines], axis=0))
    return np.where(nbytes > 0, out, 0.0)


def _p2p_array(problem: Problem, src, dst, nbytes: np.ndarray) -> np.ndarray:
    cl = problem.cluster
    out = np.zeros_like(nbytes)
    for lvl in sorted({cl.level_of(a, b) for a, b in zip(src, dst)}):
        if lvl < 0:
            continue
        out = np.maximum(out, nbytes / path_bandwidth(cl, lvl) + cl.levels[lvl].latency_s)
    return np.where(nbytes > 0, out, 0.0)


def fixed_memory(problem: Problem, la: LayerArrays, v: Variant, d: int, zeros) -> np.ndarray:
    """Memory of a stage a..b that does not depend on its pipeline position, per (z, r):
    weights, gradients and optimizer states (ZeRO-sharded) and the recomputation working set."""
    tr = problem.training
    wb, gb, osb = tr.weight_bytes_per_param, tr.grad_bytes_per_param, tr.optimizer_state_bytes
    L, R = la.comp_LR.shape

    def sharded(on: bool) -> np.ndarray:
        return per_device(la.pd_LL, la.pe_LL, d, v.ep, v.cp, on)

    out = np.empty((L, L, len(zeros), R))
    for zi, z in enumerate(zeros):
        states = wb * sharded(z >= 3) + gb * sharded(z >= 2) + osb * sharded(z >= 1)
        working = la.work_LLR + (wb * la.maxpar_LL[..., None] if z == 3 else 0.0)
        out[:, :, zi, :] = states[..., None] + working
    return out


def fits(problem: Problem, fixed_LLZR: np.ndarray, la: LayerArrays, stash: int) -> np.ndarray:
    """Whether the stage's peak memory (evaluator formula) fits in HBM, per [b, a, z, r]."""
    hw = problem.cluster.hardware
    alloc = fixed_LLZR + stash * la.act_LLR[:, :, None, :]
    mem = alloc + alloc * hw.memory_fragmentation + hw.memory_overhead_bytes
    return mem <= hw.hbm_bytes


@dataclass
class StageArrays:
    t_JLLO: np.ndarray
    u_JLLZ: np.ndarray
    ok_JLLO: np.ndarray
    device_ids: list[tuple[int, ...]]
    num_microbatches: int


def stage_arrays(problem: Problem, space: SearchSpace, la: LayerArrays, v: Variant, p: int,
                 d: int, placement: str) -> StageArrays:
    g, cl, tr, hw = problem.graph, problem.cluster, problem.training, problem.cluster.hardware
    modes, zeros = space.recompute_modes, space.zero_stages
    R, Z, L = len(modes), len(zeros), g.num_layers
    m = problem.num_microbatches(d, v.ep)
    ids = place(p, d, v.width, placement)
    wb, gb = tr.weight_bytes_per_param, tr.grad_bytes_per_param
    pd_LL, pe_LL = la.pd_LL, la.pe_LL
    valid_LL = np.tril(np.ones((L, L), dtype=bool))  # a <= b

    def sharded(on: bool) -> np.ndarray:
        return per_device(pd_LL, pe_LL, d, v.ep, v.cp, on)

    fixed_LLZR = fixed_memory(problem, la, v, d, zeros)
    opt_LLZ = np.stack([tr.optimizer_step_bytes * sharded(z >= 1)
                        / (hw.hbm_bytes_per_s * hw.memory_efficiency) for z in zeros], axis=-1)

    full_idx = [i for i, r in enumerate(modes) if r == "full"]
    by_groups = la.group_cache  # stages whose device sets are shifted copies share their arrays

    def group_terms(stage_ids):
        key = (d, shifted(cl, stage_ids))
        if key in by_groups:
            by_groups.move_to_end(key)
            return by_groups[key]
        groups = inner_groups(stage_ids, v.tp, v.cp, v.ep, d)
        dg = distinct(cl, groups["dp_dense"])
        eg = distinct(cl, groups["dp_expert"])
        coll_LR = np.zeros((L, R))  # the sub-graph variant's collectives per layer
        cache: dict[int, np.ndarray] = {}
        for li, c in enumerate(la.costs):
            if id(c) not in cache:
                row = np.zeros(R)
                for col in c.collectives:
                    x = worst(cl, col.kind, groups[col.group], col.bytes) * col.count
                    row += x
                    if col.phase == "fwd":
                        row[full_idx] += x  # full recomputation re-runs forward collectives
                cache[id(c)] = row
            coll_LR[li] = cache[id(c)]
        zc_LLZ = np.zeros((L, L, Z))
        sync_LLZ = np.zeros((L, L, Z))

        def both(kind: str, bytes_per_param: float) -> np.ndarray:
            return (_coll_array(problem, kind, dg, bytes_per_param * pd_LL)
                    + _coll_array(problem, kind, eg, bytes_per_param * pe_LL))

        for zi, z in enumerate(zeros):
            if z >= 2:
                zc_LLZ[..., zi] += both("reduce_scatter", gb)
            if z == 3:
                zc_LLZ[..., zi] += 2 * both("all_gather", wb)
            if z == 0:
                sync_LLZ[..., zi] = both("all_reduce", gb)
            if z == 1:
                sync_LLZ[..., zi] += both("reduce_scatter", gb)
            if z in (1, 2):
                sync_LLZ[..., zi] += both("all_gather", wb)
        out = (la.comp_LLR + range_sum(coll_LR), zc_LLZ, sync_LLZ + opt_LLZ)
        by_groups[key] = out
        if len(by_groups) > GROUP_CACHE_ENTRIES:
            by_groups.popitem(last=False)
        return out

    t_J, u_J, ok_J = [], [], []
    prev_out = np.concatenate([[0.0], la.out_L[:-1]])
    for j in range(p):
        base_LLR, zc_LLZ, u_LLZ = group_terms(ids[j])
        if g.tied_embeddings and p > 1 and j in (0, p - 1):
            other = ids[p - 1 - j]
            emb = gb * problem.model.vocab_size * problem.model.hidden_size / v.tp
            u_LLZ = u_LLZ + max(collective_time(cl, "all_reduce", (a, b), emb)
                                for a, b in zip(ids[j], other))
        p2p_LL = np.zeros((L, L))
        if j + 1 < p:  # forward send of the stage's last layer output (depends on b)
            p2p_LL += _p2p_array(problem, ids[j], ids[j + 1], la.out_L)[:, None]
        if j > 0:  # backward send to the previous stage: the output of layer a-1 (depends on a)
            p2p_LL += _p2p_array(problem, ids[j], ids[j - 1], prev_out)[None, :]
        t_LLZR = base_LLR[:, :, None, :] + zc_LLZ[:, :, :, None] + p2p_LL[:, :, None, None]
        ok_LLZR = fits(problem, fixed_LLZR, la, min(p - j, m)) & valid_LL[:, :, None, None]
        t_J.append(t_LLZR.reshape(L, L, Z * R))
        ok_J.append(ok_LLZR.reshape(L, L, Z * R))
        u_J.append(u_LLZ)
    return StageArrays(np.stack(t_J), np.stack(u_J), np.stack(ok_J), ids, m)
