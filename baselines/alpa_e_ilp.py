"""Alpa-E intra-operator pass: the per-stage sharding ILP on Alpa's 2-D mesh view (Zheng et al.
2022, "Alpa", OSDI, section 4), priced with our cost model instead of Alpa's profiler.

At our layer granularity a node of Alpa's ILP is a layer, and its sharding options are the model's
sub-graph variants that fit the stage's submesh: for a pipeline whose micro-batch is D slices of
mbs sequences, a stage on S = D * x devices may run a layer with any variant v of tp * cp = x
whose ep divides D (the layer is then data-parallel over d = D / ep replicas). The ILP (Alpa
section 4.2, Eq. 1) over one-hot choices s_l is

    min  sum_l s_l . c_l  +  sum_l s_l^T R_l s_(l+1),

linearised with edge variables e_l = s_l s_(l+1)^T through their marginals (`solve_ilp`, HiGHS).
c_l is the option's communication per micro-batch, as in Alpa (compute costs zero, since every
option divides the heavy operators evenly; compute enters with a small weight only to break exact
ties): its own collectives (tp / ep / cp, alpha-beta, re-run in backward under remat), and its share
of the stage's bucketed ZeRO and gradient-synchronisation collectives at the bucket's cost per byte,
synchronisation amortised over the B micro-batches. R_l is the resharding of layer l's output
between layouts, forward and backward: sequence-sharded <-> replicated costs an all-gather over the
tp group; layouts that only differ in ep are the same (each batch slice stays on its device); any
other change an all-gather over the x devices of a replica.

The latency of the chosen sharding (what Alpa's profiler measures, our estimate here): compute +
its collectives + resharding + the stage's bucketed ZeRO collectives + (gradient sync + optimizer
step) / B. Every per-layer term is the shared stage kernel's on the 2-D mesh (`sharding_table`:
nest.costs.layers.layer_table for compute, recomputation, activations, working sets, parameters
and the tied embedding; nest.costs.groups.group_terms for the option's collectives, with
tp_comm_overlap and full recomputation's re-run forward collectives; its data-parallel lines and
nest.costs.stage.zero_costs for ZeRO and the sync, with param_gather_overlap; nest.costs.memory
for states with FP8 weight caches and ZeRO-3's gathered layer), so a setting that changes the
kernel changes Alpa-E's prices with no code here. Memory is not an ILP constraint: it is checked
after the sharding is chosen ("post hoc"), with the evaluator's formula.

Array legend: L layers, V sharding options, O knob configs (ZeRO stage x recomputation), K first
layer and I last layer of a stage range.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from nest.costs.groups import SYNC_KINDS, placement_group_terms
from nest.costs.layers import layer_table, range_max, range_sum
from nest.costs.memory import optimizer_step_for, resident_and_step, state_bytes, working_bytes
from nest.costs.stage import bytes_per_param, zero_costs, zero_schedule
from nest.network.collectives import lines_time
from nest.problem.problem import Problem
from nest.graph.layer_graph import Variant
from nest.network.collectives import collective_time
from nest.spec.catalog import ClusterSpec, NetworkLevel


# --------------------------------------------------------------------------------------------
# Alpa's view of the cluster
# --------------------------------------------------------------------------------------------


def mesh_view(cluster: ClusterSpec) -> ClusterSpec:
    """Alpa's 2-D device mesh (nodes x devices per node) with its two bandwidths: the node level,
    and one inter-node level at the per-device bandwidth between two nodes of the real network
    (the first level above the node). No deeper hierarchy, no oversubscription."""
    lv0 = cluster.levels[0]
    node = replace(lv0, oversubscription=1.0)
    if len(cluster.levels) == 1:
        return replace(cluster, name=f"{cluster.name}_mesh2d", levels=(node,))
    lv1 = cluster.levels[1]
    inter = NetworkLevel("inter_node", cluster.max_devices, min(lv0.bytes_per_s, lv1.bytes_per_s),
                         lv1.latency_s, 1.0)
    return replace(cluster, name=f"{cluster.name}_mesh2d", levels=(node, inter))


def submesh_sizes(num_devices: int, per_node: int) -> list[int]:
    """Alpa's submesh shapes (section 5.2): (1, 2^k) inside a node and (n, M) whole nodes."""
    if num_devices <= per_node:  # one node: (1, 2^k) and the whole node
        return sorted({1 << k for k in range(num_devices.bit_length())} | {num_devices})
    small = [1 << k for k in range(per_node.bit_length()) if 1 << k < per_node]
    return small + [n * per_node for n in range(1, num_devices // per_node + 1)]


# --------------------------------------------------------------------------------------------
# The ILP and its references
# --------------------------------------------------------------------------------------------


def solve_ilp(node_NV: np.ndarray, edge_EVV: np.ndarray) -> tuple[float, list[int]]:
    """Alpa's ILP for a chain of N nodes with V options each (HiGHS via scipy.optimize.milp).
    node_NV[n, a]: cost of option a at node n (inf: not allowed); edge_EVV[n, a, b]: cost of
    node n taking a and node n+1 taking b. Returns (objective, choice per node)."""
    N, V = node_NV.shape
    allowed = np.isfinite(node_NV)
    ns = N * V
    ne = (N - 1) * V * V
    c = np.concatenate([np.where(allowed, node_NV, 0.0).ravel(), edge_EVV.ravel()])
    rows, cols, vals, lo, hi = [], [], [], [], []
    r = 0

    def add(cs, vs, lb, ub):
        nonlocal r
        rows.extend([r] * len(cs))
        cols.extend(cs)
        vals.extend(vs)
        lo.append(lb)
        hi.append(ub)
        r += 1

    for n in range(N):  # one option per node
        add([n * V + a for a in range(V)], [1.0] * V, 1.0, 1.0)
    for n in range(N - 1):  # e_n[a, b] = s_n[a] s_{n+1}[b] through its marginals
        base = ns + n * V * V
        for a in range(V):
            add([base + a * V + b for b in range(V)] + [n * V + a], [1.0] * V + [-1.0], 0.0, 0.0)
        for b in range(V):
            add([base + a * V + b for a in range(V)] + [(n + 1) * V + b], [1.0] * V + [-1.0],
                0.0, 0.0)
    ub = np.ones(ns + ne)
    ub[:ns] = allowed.ravel()
    A = coo_matrix((vals, (rows, cols)), shape=(r, ns + ne))
    res = milp(c, constraints=LinearConstraint(A, lo, hi), integrality=np.ones(ns + ne),
               bounds=Bounds(np.zeros(ns + ne), ub))
    if res.status != 0 or res.x is None:
        raise RuntimeError(f"HiGHS failed on the sharding ILP: {res.message}")
    choice = [int(np.argmax(res.x[n * V:(n + 1) * V])) for n in range(N)]
    return chain_cost(node_NV, edge_EVV, choice), choice


def chain_cost(node_NV, edge_EVV, choice) -> float:
    return float(sum(node_NV[n, a] for n, a in enumerate(choice))
                 + sum(edge_EVV[n, a, b] for n, (a, b) in enumerate(zip(choice, choice[1:]))))


def brute_force_ilp(node_NV, edge_EVV) -> tuple[float, list[int]]:
    """Every assignment of options to nodes (for tests); first minimum in product order."""
    N, V = node_NV.shape
    best, arg = np.inf, None
    for choice in itertools.product(range(V), repeat=N):
        c = chain_cost(node_NV, edge_EVV, choice)
        if c < best:
            best, arg = c, list(choice)
    return best, arg


# --------------------------------------------------------------------------------------------
# Per-layer costs of every option on one submesh
# --------------------------------------------------------------------------------------------


@dataclass
class ShardingTable:
    """Per-layer costs on a submesh of S = D * x devices, B micro-batches (legend above), each
    the shared stage kernel's per-layer term of the option's variant on the submesh
    (nest.costs.layers.layer_table, nest.costs.groups.group_terms on Alpa's mesh view)."""

    D: int
    x: int
    B: int
    variants: tuple[Variant, ...]
    knobs: tuple[tuple[int, str], ...]  # (zero stage, recompute mode) per O
    comm_LVO: np.ndarray  # the ILP's node costs: communication per micro-batch
    coll_LVO: np.ndarray  # the option's own collectives (tp / ep / cp), seconds
    comp_LVO: np.ndarray  # compute: fwd + bwd + recomputed fwd + optimizer step / B
    fwd_LVO: np.ndarray  # the forward part of compute + collectives (param_gather_overlap)
    dense_LV: np.ndarray  # parameters per device, replicated over the D * cp dense group
    expert_LV: np.ndarray  # expert parameters per device
    states_LVO: np.ndarray  # weights + gradients + optimizer states held, bytes (resident)
    act_LVO: np.ndarray  # activations stashed per micro-batch, bytes
    work_LVO: np.ndarray  # working set of a recomputed layer, bytes
    params_LV: np.ndarray  # a layer's parameters per device (ZeRO-3 gathers one layer at a time)
    resh_LVV: np.ndarray  # resharding cost of layer l's output between options (l < L-1)
    tied_V: np.ndarray  # the LM head's copy of a tied embedding (dense params per device)
    tied_states_VO: np.ndarray  # its states, saved when one stage holds embedding and head
    tied_step_VO: np.ndarray  # and its optimizer step / B
    dp_lines: list  # per option: the kernel's data-parallel lines (GroupTerms.dp_lines)
    training: object = None  # the training settings (bytes per parameter, overlaps)
    hw: object = None  # the hardware (optimizer step)
    # the optimizer step's transient FP32 gradient copy (BF16 reduce; nest.costs.memory.
    # allocated: held with the states only, after the activations are freed); None: no copy
    copy_LVO: np.ndarray | None = None
    tied_copy_VO: np.ndarray | None = None


def slope(lines: list) -> float:
    """Seconds per byte of a large buffer (Alpa prices communication as bytes / bandwidth)."""
    return max((min(b for _, b in grp) for grp in lines), default=0.0)


def bucket_time(tab: ShardingTable, vi: int, o: int, pd, pe, fwd=None):
    """ZeRO and gradient-synchronisation collectives of a stage's parameters held with option vi,
    bucketed per stage as the evaluator (and XLA's all-reduce combiner) does: the stage kernel's
    per-micro-batch ZeRO collectives (nest.costs.stage.zero_costs, on its data-parallel lines)
    plus the once-per-batch synchronisation amortised over B; fwd: the stage's forward (what
    hides the weights' all-gather under param_gather_overlap)."""
    z = tab.knobs[o][0]
    ln = tab.dp_lines[vi]

    def both(kind, which):
        n = bytes_per_param(tab.training, which)
        return lines_time(ln["dense"][kind], n * pd) + lines_time(ln["expert"][kind], n * pe)

    per_mb, sync = zero_costs(z, both, tab.training, fwd, pd + pe)
    return sum(per_mb.values(), 0.0) + sum(sync.values(), 0.0) / tab.B


def mesh_problem(problem: Problem, mesh: ClusterSpec) -> Problem:
    """The problem on Alpa's mesh view (its own layer tables and group terms), made once per
    problem and mesh (kept in the problem's cache, so every sharding table of a search reads
    the same layer tables and group terms instead of rebuilding them per (D, x))."""
    if mesh == problem.cluster:
        return problem
    return problem.cache.get("alpa_e_mesh_problem", mesh, lambda: problem.with_cluster(mesh))


def sharding_table(problem: Problem, mesh: ClusterSpec, D: int, x: int,
                   variants: list[Variant], knobs, B: int) -> ShardingTable:
    pm = mesh_problem(problem, mesh)
    g, tr, hw = pm.graph, pm.training, pm.cluster.hardware
    L, V, O = g.num_layers, len(variants), len(knobs)
    modes = tuple(dict.fromkeys(r for _, r in knobs))
    ids = tuple(range(D * x))  # a submesh's costs on the 2-D mesh do not depend on where it sits
    shape = (L, V, O)
    comm, coll, comp, fwd, states, act, work = (np.zeros(shape) for _ in range(7))
    dense, expert, params = np.zeros((L, V)), np.zeros((L, V)), np.zeros((L, V))
    tied, tied_states, tied_step = np.zeros(V), np.zeros((V, O)), np.zeros((V, O))
    copy, tcopy = np.zeros(shape), np.zeros((V, O))
    all_lines = []
    lts = [layer_table(pm, v, modes) for v in variants]
    # the options' group terms (nest.costs.groups.group_terms of the submesh), the priced-alike
    # keys of the options with one d computed together (once per distinct tp, cp, ep)
    gts: list = [None] * V
    by_d: dict[int, list[int]] = {}
    for vi, v in enumerate(variants):
        by_d.setdefault(D // v.ep, []).append(vi)
    for d, vis in by_d.items():
        for vi, found in zip(vis, placement_group_terms(pm, [lts[vi] for vi in vis], [ids], d)):
            gts[vi] = found[0]
    for vi, v in enumerate(variants):
        d = D // v.ep
        lt, gt = lts[vi], gts[vi]
        all_lines.append(gt.dp_lines)
        slopes = {(kind, part): slope(gt.dp_lines[part][kind])
                  for kind in SYNC_KINDS for part in ("dense", "expert")}

        def per_byte(kind, which, sl=slopes, lt=lt):  # the ILP's share of a bucketed collective
            return bytes_per_param(tr, which) * (sl[(kind, "dense")] * lt.dense_L
                                                 + sl[(kind, "expert")] * lt.expert_L)

        def step(pd, pe, z, d=d, v=v):
            return optimizer_step_for(pd, pe, d, v.ep, v.cp, z, tr, hw)

        fp8_L = np.diagonal(lt.fp8_LL)  # a layer's own FP8-GEMM parameters
        dense[:, vi], expert[:, vi] = lt.dense_L, lt.expert_L
        params[:, vi] = lt.dense_L + lt.expert_L
        tied[vi] = lt.tied
        for oi, (z, r) in enumerate(knobs):
            ri = modes.index(r)
            coll[:, vi, oi] = gt.layer_LR[:, ri]  # full recomputation re-runs the forward ones
            per_mb, sync = zero_schedule(z, per_byte)
            comm[:, vi, oi] = (coll[:, vi, oi] + sum(per_mb.values(), 0.0)
                               + sum(sync.values(), 0.0) / B)
            comp[:, vi, oi] = lt.comp_LR[:, ri] + step(lt.dense_L, lt.expert_L, z) / B
            fwd[:, vi, oi] = lt.fwd_L + gt.fwd_L
            res, stp = resident_and_step(state_bytes(lt.dense_L, lt.expert_L, d, v.ep, v.cp, z,
                                                     tr, fp8_L))
            states[:, vi, oi], copy[:, vi, oi] = res, stp - res
            act[:, vi, oi] = lt.act_LR[:, ri]
            work[:, vi, oi] = lt.work_LR[:, ri]
            res, stp = resident_and_step(state_bytes(lt.tied, 0.0, d, v.ep, v.cp, z, tr))
            tied_states[vi, oi], tcopy[vi, oi] = res, stp - res
            tied_step[vi, oi] = step(lt.tied, 0.0, z) / B
    resh = np.zeros((max(L - 1, 0), V, V))
    # resharding_time reads only the two options' (tp, cp, sp) and the bytes: each distinct call
    # once (DeepSeek-V3: 196 options, 62 boundaries, ~40 distinct layouts), and a boundary's
    # [a, b] block is its distinct (layout, bytes) rows x distinct layout columns spread out
    lays: dict = {}
    lay = np.array([lays.setdefault((w.tp, w.cp, w.sp), len(lays)) for w in variants],
                   dtype=np.int64)
    rep = [variants[int(np.flatnonzero(lay == c)[0])] for c in range(len(lays))]
    seen: dict = {}
    for li in range(L - 1):
        costs = g.layers[li].costs
        rows: dict = {}  # (layout, the whole boundary activation) -> row
        row = np.array([rows.setdefault((int(lay[a]), costs[u.key].output_bytes * u.tp),
                                        len(rows)) for a, u in enumerate(variants)],
                       dtype=np.int64)
        block = np.empty((len(rows), len(lays)))
        for (ca, full), r in rows.items():
            for cb, w in enumerate(rep):
                key = (ca, cb, full)
                if key not in seen:
                    seen[key] = resharding_time(mesh, rep[ca], w, full)
                block[r, cb] = seen[key]
        resh[li] = block[row][:, lay]
    return ShardingTable(D, x, B, tuple(variants), tuple(knobs), comm, coll, comp, fwd, dense,
                         expert, states, act, work, params, resh, tied, tied_states, tied_step,
                         all_lines, tr, hw, *((copy, tcopy) if copy.any() else ()))


def held(tab: ShardingTable, o: int, states, work, max_params):
    """Memory of a stage not scaling with its stash: states, the working set of one recomputed
    layer and ZeRO-3's gathered layer (nest.costs.memory.working_bytes)."""
    return states + working_bytes(work, max_params, tab.knobs[o][0], tab.training)


def tied_copy(tab: ShardingTable, vi: int, o: int) -> float:
    """The optimizer step's copy of the tied embedding's gradient a stage holding both ends
    does not hold twice (0 without a copy)."""
    return 0.0 if tab.tied_copy_VO is None else tab.tied_copy_VO[vi, o]


def untied(tab: ShardingTable, vi: int, o: int):
    """What a stage holding both the embedding and a tied head does not hold twice
    (nest.costs.memory.tied_embedding_params): (dense parameters, state bytes, step / B)."""
    return tab.tied_V[vi], tab.tied_states_VO[vi, o], tab.tied_step_VO[vi, o]


def resharding_time(mesh: ClusterSpec, u: Variant, w: Variant, full_bytes: float) -> float:
    """Layout change of a boundary activation from option u to option w (forward + backward)."""
    if (u.tp, u.cp, u.sp) == (w.tp, w.cp, w.sp):
        return 0.0  # ep only regroups replicas: each batch slice stays on its device
    if (u.tp, u.cp) == (w.tp, w.cp):  # sequence-sharded <-> replicated over the tp group
        return 2 * collective_time(mesh, "all_gather", tuple(range(u.tp)), full_bytes)
    return 2 * collective_time(mesh, "all_gather", tuple(range(u.tp * u.cp)), full_bytes)


def stage_cost(tab: ShardingTable, o: int, k: int, i: int, choice,
               tiebreak: float) -> tuple[float, ...]:
    """(ILP objective, latency, fixed memory, activation memory per micro-batch) of stage k..i
    with per-layer options `choice` and knob config o: the plain-Python reference."""
    L = tab.comm_LVO.shape[0]
    node = tab.comm_LVO[:, :, o] + tiebreak * tab.comp_LVO[:, :, o]
    layers = list(range(k, i + 1))
    resh = sum(tab.resh_LVV[k + n, a, b] for n, (a, b) in enumerate(zip(choice, choice[1:])))
    obj = sum(node[li, a] for li, a in zip(layers, choice)) + resh
    t = sum(tab.comp_LVO[li, a, o] + tab.coll_LVO[li, a, o] for li, a in zip(layers, choice))
    fixed = held(tab, o, sum(tab.states_LVO[li, a, o] for li, a in zip(layers, choice)),
                 max(tab.work_LVO[li, a, o] for li, a in zip(layers, choice)),
                 max(tab.params_LV[li, a] for li, a in zip(layers, choice)))
    act = sum(tab.act_LVO[li, a, o] for li, a in zip(layers, choice))
    fwd = sum(tab.fwd_LVO[li, a, o] for li, a in zip(layers, choice))
    both_ends = k == 0 and i == L - 1
    for vi in sorted(set(choice)):
        pd = sum(tab.dense_LV[li, a] for li, a in zip(layers, choice) if a == vi)
        pe = sum(tab.expert_LV[li, a] for li, a in zip(layers, choice) if a == vi)
        if both_ends and choice[0] == vi:
            pd -= untied(tab, vi, o)[0]
        t += float(bucket_time(tab, vi, o, pd, pe, fwd))
    if both_ends:
        _, states, step = untied(tab, choice[0], o)
        fixed -= states
        t -= step
    return float(obj), float(t + resh), float(fixed), float(act)


# --------------------------------------------------------------------------------------------
# Every stage range: the ILP's optimum and the chosen sharding's latency and memory
# --------------------------------------------------------------------------------------------


@dataclass
class RangeTables:
    """For stage ranges k..i (arrays [o, k, i]; inf where i < k)."""

    obj_OKI: np.ndarray  # the ILP's optimum
    time_OKI: np.ndarray  # estimated latency per micro-batch of the ILP's sharding
    fixed_OKI: np.ndarray  # memory not scaling with stashed micro-batches, bytes
    act_OKI: np.ndarray  # activations per stashed micro-batch, bytes
    uniform_OKI: np.ndarray  # bitmask of the single options that reach the ILP optimum
    last_OKI: np.ndarray  # the option of the range's last layer
    ptr: list = field(default_factory=list)  # per o: back-pointers to recover the sharding
    # what the optimizer step holds (states + its FP32 gradient copy), bytes; None: no copy
    # (allocated: nest.costs.pipeline.held_bytes(fixed, stash, act, step))
    step_OKI: np.ndarray | None = None


def _empty(O: int, L: int, copy: bool = False) -> RangeTables:
    return RangeTables(*(np.full((O, L, L), np.inf) for _ in range(4)),
                       np.zeros((O, L, L), dtype=np.int64), np.zeros((O, L, L), dtype=np.int64),
                       step_OKI=np.full((O, L, L), np.inf) if copy else None)


def range_tables(tab: ShardingTable, tiebreak: float, per_stage: bool = False) -> RangeTables:
    """The ILP of every stage range k..i and every knob config, solved exactly by dynamic
    programming along the chain (the stage graph at layer granularity is a chain and the LP of a
    tree-structured ILP is integral, so this is the ILP's optimum; `solve_ilp` solves the same ILP
    with HiGHS and the planner re-solves the chosen stages with it). All ranges at once: one
    Viterbi step per last layer i over every first layer k, carrying the chosen sharding's
    latency, memory and per-option parameter sums along its path. Ties go to the lowest option.
    per_stage: one option for the whole stage (the ILP restricted to one variant per stage).
    Every knob config o at once: each array carries a leading o axis and every step is the
    elementwise arithmetic of one o alone (tests/test_alpa_e_rt.py: bit for bit a loop over o)."""
    L, V, O = tab.comm_LVO.shape
    if per_stage or V == 1:
        return _per_stage_tables(tab, tiebreak)
    valid = np.triu(np.ones((L, L), dtype=bool))
    out = _empty(O, L, tab.copy_LVO is not None)
    cols = np.arange(V)
    # options b whose resharding column R[:, b] is the same (the same tp, cp, sp: ep only
    # regroups replicas) get the same argmin over a: it is taken once per distinct column
    # (bit for bit the same sums and the same first least a; tests/test_baseline_alpa_e.py)
    col_of = [_column_classes(tab.resh_LVV[i]) for i in range(L - 1)]

    def per_o(x_LVO):  # [o, layer, option]
        return np.ascontiguousarray(x_LVO.transpose(2, 0, 1))

    node = per_o(tab.comm_LVO + tiebreak * tab.comp_LVO)
    time_ = per_o(tab.coll_LVO + tab.comp_LVO)
    st_, act_, work_, fwd_ = (per_o(x) for x in (tab.states_LVO, tab.act_LVO, tab.work_LVO,
                                                  tab.fwd_LVO))
    cp_ = per_o(tab.copy_LVO) if tab.copy_LVO is not None else np.zeros((O, L, V))
    # path state per (o, first layer k, option b of the current layer i); rows k <= i live
    # the path's state per (o, first layer k, option b of layer i), rows k <= i live, fields
    # latency, states, activations, step copy, forward, work, parameters (max), first option
    f = np.full((O, L, V), np.inf)
    S = np.full((O, L, V, 8), np.inf)
    add = np.stack([st_, act_, cp_, fwd_], axis=3)  # the fields summed along the path
    P = np.zeros((O, L, V, V, 2))  # [o, k, b, option, dense | expert]: parameter sums
    par_LV2 = np.stack([tab.dense_LV, tab.expert_LV], axis=2)
    S_OKI, P_OKI = np.zeros((O, L, L, 8)), np.zeros((O, L, L, V, 2))
    ptrs: list[list] = [[] for _ in range(O)]
    oo = np.arange(O)[:, None]
    for i in range(L):
        if i > 0:
            R = tab.resh_LVV[i - 1]  # [a, b]
            rep, cls = col_of[i - 1]
            cand = f[:, :i, :, None] + R[:, rep][None, None]  # [o, k, a, distinct column]
            a_c = cand.argmin(axis=2)
            a = a_c[:, :, cls]  # [o, k, b]
            rows = np.arange(i)[None, :, None]
            f[:, :i] = (cand[oo[:, :, None], rows, a_c,
                             np.arange(a_c.shape[2])[None, None, :]][:, :, cls]
                        + node[:, i, None, :])
            G = S[:, :i][oo[:, :, None], rows, a]  # the state at the path's option a
            S[:, :i, :, 0] = G[..., 0] + R[a, cols] + time_[:, i, None, :]
            S[:, :i, :, 1:5] = G[..., 1:5] + add[:, i, None]
            S[:, :i, :, 5] = np.maximum(G[..., 5], work_[:, i, None, :])
            S[:, :i, :, 6] = np.maximum(G[..., 6], tab.params_LV[i])
            S[:, :i, :, 7] = G[..., 7]
            # + eye * the layer's parameters: off the diagonal that adds 0.0, which leaves
            # every finite sum as it is; on it, the option held at layer i
            P[:, :i] = P[:, :i][oo[:, :, None], rows, a]
            P[:, :i, cols, cols] += par_LV2[i]
            for o in range(O):
                ptrs[o].append(a[o])
        f[:, i] = node[:, i]
        S[:, i, :, 0], S[:, i, :, 1:5], S[:, i, :, 5] = time_[:, i], add[:, i], work_[:, i]
        S[:, i, :, 6], S[:, i, :, 7] = tab.params_LV[i], cols
        P[:, i] = 0.0
        P[:, i, cols, cols] = par_LV2[i]
        b = f[:, :i + 1].argmin(axis=2)  # [o, k]
        at = (oo, np.arange(i + 1)[None, :], b)
        out.obj_OKI[:, :i + 1, i] = f[at]
        S_OKI[:, :i + 1, i], P_OKI[:, :i + 1, i] = S[at], P[at]
        out.last_OKI[:, :i + 1, i] = b
    out.ptr = ptrs
    out.time_OKI[:, valid] = S_OKI[:, valid, 0]
    out.act_OKI[:, valid] = S_OKI[:, valid, 2]
    st_OKI, cp_OKI, fw_OKI, wk_OKI, pm_OKI = (S_OKI[..., n] for n in (1, 3, 4, 5, 6))
    pd_OKIV, pe_OKIV = P_OKI[..., 0], P_OKI[..., 1]
    tied = S_OKI[:, 0, L - 1, 7].astype(int)  # the first layer's option, range 0..L-1
    for o in range(O):
        fixed = held(tab, o, st_OKI[o], wk_OKI[o], pm_OKI[o])
        step = st_OKI[o] + cp_OKI[o]
        # one stage holding embedding and head keeps one tied copy
        e = int(tied[o])
        tied_params, tied_states, tied_step = untied(tab, e, o)
        pd_OKIV[o, 0, L - 1, e] -= tied_params
        fixed[0, L - 1] -= tied_states
        step[0, L - 1] -= tied_states + tied_copy(tab, e, o)
        out.time_OKI[o, 0, L - 1] -= tied_step
        out.fixed_OKI[o][valid] = fixed[valid]
        if out.step_OKI is not None:
            out.step_OKI[o][valid] = step[valid]
        # the stage's bucketed ZeRO / sync collectives, per option held: an option no range
        # holds (no parameters in any range) adds 0.0 everywhere (lines_time is 0 for no bytes),
        # which leaves every sum as it is, so it is skipped
        held_V = (pd_OKIV[o] != 0).any(axis=(0, 1)) | (pe_OKIV[o] != 0).any(axis=(0, 1))
        for vi in np.flatnonzero(held_V):
            out.time_OKI[o] += np.where(valid, bucket_time(tab, vi, o, pd_OKIV[o, ..., vi],
                                                           pe_OKIV[o, ..., vi], fw_OKI[o]), 0.0)
        node_LV = node[o]
        for vi in range(V):  # a single option as good as the ILP: maps onto one variant
            same = valid & (range_sum(node_LV[:, vi]).T <= out.obj_OKI[o] * (1 + 1e-9) + 1e-15)
            out.uniform_OKI[o] |= np.where(same, 1 << vi, 0)
    return out


def _column_classes(R_VV: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the first column b of each distinct column of R, each column's class): R[:, b] ==
    R[:, first[cls[b]]] byte for byte."""
    seen: dict = {}
    cls = np.array([seen.setdefault(R_VV[:, b].tobytes(), len(seen))
                    for b in range(R_VV.shape[1])], dtype=np.int64)
    first = np.array([int(np.flatnonzero(cls == c)[0]) for c in range(len(seen))],
                     dtype=np.int64)
    return first, cls


def _per_stage_tables(tab: ShardingTable, tiebreak: float) -> RangeTables:
    """One option for the whole stage (no resharding inside): per range, the option with the
    least objective (lowest index on ties)."""
    L, V, O = tab.comm_LVO.shape
    valid = np.triu(np.ones((L, L), dtype=bool))
    out = _empty(O, L, tab.copy_LVO is not None)
    # what does not depend on the knob config, once per option (for the options some range
    # takes: `chosen`)
    free: dict[int, tuple] = {}
    unread = np.zeros((L, L))  # an option's entries no range takes
    for o in range(O):
        node_LV = tab.comm_LVO[:, :, o] + tiebreak * tab.comp_LVO[:, :, o]
        obj = np.stack([np.where(valid, range_sum(node_LV[:, v]).T, np.inf) for v in range(V)])
        best = obj.argmin(axis=0)
        out.obj_OKI[o] = obj.min(axis=0)
        per_v = {"time": [], "fixed": [], "act": [], "step": []}
        # only an option that is some range's best is read below (the others' entries are
        # never taken; at i < k, where every option is inf, option 0 is taken and masked)
        chosen = np.zeros(V, dtype=bool)
        chosen[best[valid]] = True
        for v in range(V):
            if not chosen[v]:
                for key in per_v:
                    per_v[key].append(unread)
                continue
            if v not in free:
                free[v] = (range_sum(tab.dense_LV[:, v]).T, range_sum(tab.expert_LV[:, v]).T,
                           range_max(tab.params_LV[:, v]).T)
            pd_v, pe_v, pm_v = free[v]
            # [k, i] = the kernel's [b, a] range tables (nest.costs.layers) transposed
            tied_params, tied_states, tied_step = untied(tab, v, o)
            pd = pd_v.copy()
            pd[0, L - 1] -= tied_params
            fixed = held(tab, o, range_sum(tab.states_LVO[:, v, o]).T,
                         range_max(tab.work_LVO[:, v, o]).T, pm_v)
            fixed[0, L - 1] -= tied_states
            tv = (range_sum(tab.coll_LVO[:, v, o] + tab.comp_LVO[:, v, o]).T
                  + bucket_time(tab, v, o, pd, pe_v,
                                range_sum(tab.fwd_LVO[:, v, o]).T))
            tv[0, L - 1] -= tied_step
            per_v["time"].append(tv)
            per_v["fixed"].append(fixed)
            per_v["act"].append(range_sum(tab.act_LVO[:, v, o]).T)
            if out.step_OKI is not None:
                step = range_sum(tab.states_LVO[:, v, o] + tab.copy_LVO[:, v, o]).T
                step[0, L - 1] -= tied_states + tied_copy(tab, v, o)
                per_v["step"].append(step)
        for key, arr in (("time", out.time_OKI), ("fixed", out.fixed_OKI), ("act", out.act_OKI),
                         ("step", out.step_OKI)):
            if arr is None:
                continue
            arr[o] = np.where(valid, np.take_along_axis(np.stack(per_v[key]), best[None],
                                                        axis=0)[0], np.inf)
        out.last_OKI[o] = best
        for v in range(V):
            same = valid & (obj[v] <= out.obj_OKI[o] * (1 + 1e-9) + 1e-15)
            out.uniform_OKI[o] |= np.where(same, 1 << v, 0)
    return out


def sharding_of(rt: RangeTables, o: int, k: int, i: int) -> list[int]:
    """The per-layer options the chain DP chose for stage k..i under knob config o."""
    choice = [int(rt.last_OKI[o, k, i])]
    if not rt.ptr:  # one option per stage
        return choice * (i - k + 1)
    for li in range(i, k, -1):
        choice.append(int(rt.ptr[o][li - 1][k, choice[-1]]))
    return choice[::-1]
