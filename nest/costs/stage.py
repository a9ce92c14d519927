"""Layers a..b x device ids x (ZeRO, recompute) -> time, tail and memory: the one stage kernel.

Every planner, bound and message prices a pipeline stage here; the evaluator is one cell of it.
A stage covers layers a..b of one sub-graph variant on `ids` (replica by replica, nest.plan), with
d data-parallel replicas, at a pipeline position that stashes `stash` micro-batches:
    t[z, r] = compute_fwd + compute_bwd + recompute[r]            (nest.costs.roofline)
            + the variant's collectives on the stage's groups     (+ forward ones again, r = full)
            + ZeRO's per-micro-batch collectives[z]               (`zero_schedule`)
            + send of the output to the next stage, of the input gradient to the previous one
    u[z]    = gradient sync[z] (`zero_schedule`) + optimizer step (HBM-bound)
            + the tied-embedding all-reduce of the first and last stage
    mem[z, r] = peak of weights, gradients, optimizer states (ZeRO-sharded), stash * activations
            and the working set (nest.costs.memory)
`stage_cost` evaluates it on one cell (a, b) or on the whole [b, a] grid of every cut at once
(the same arithmetic, NumPy broadcasting); `Options` is the one encoding of the per-stage knobs
(o = z_index * R + r_index). Legend: L layers (b: last, a: first), K collective terms,
Z ZeRO stages, R recomputation modes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from nest.costs.memory import (optimizer_step_s, peak, per_device, state_bytes,
                               tied_embedding_params, with_overheads, working_bytes)
from nest.graph.layer_graph import Variant
from nest.network.collectives import (collective_time, group_lines, group_lines_by_kind,
                                      lines_time, pairs, send_time, shifted, span_level)

GROUP_CACHE_ENTRIES = 256  # each entry holds O(K L) floats; bounded so memory stays small
SYNC_KINDS = ("all_reduce", "reduce_scatter", "all_gather")


@dataclass(frozen=True)
class Options:
    """The per-stage knobs a planner chooses, encoded o = z_index * R + r_index."""

    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    recompute_modes: tuple[str, ...] = ("none", "selective", "full")

    @property
    def size(self) -> int:
        return len(self.zero_stages) * len(self.recompute_modes)

    def encode(self, zero_stage: int, recompute: str) -> int:
        return (self.zero_stages.index(zero_stage) * len(self.recompute_modes)
                + self.recompute_modes.index(recompute))

    def decode(self, o: int) -> tuple[int, str]:
        R = len(self.recompute_modes)
        return self.zero_stages[o // R], self.recompute_modes[o % R]

    def zero_index(self, o):
        return o // len(self.recompute_modes)

    def per_option(self, x_Z: np.ndarray) -> np.ndarray:
        """An array over ZeRO stages (last axis) spread over the options (last axis O)."""
        return np.repeat(x_Z, len(self.recompute_modes), axis=-1)


# --------------------------------------------------------------------------------------------
# Per-variant layer tables
# --------------------------------------------------------------------------------------------


@dataclass
class LayerTable:
    """Per-layer vectors of one variant and their range tables over every stage a..b."""

    variant: Variant
    modes: tuple[str, ...]
    fwd_L: np.ndarray  # forward compute per layer, seconds
    bwd_L: np.ndarray
    rec_LR: np.ndarray  # recomputed forward per layer and mode
    act_LR: np.ndarray  # bytes saved for backward per micro-batch
    work_LR: np.ndarray  # act(none) - act(r): working set of a recomputed layer
    dense_L: np.ndarray
    expert_L: np.ndarray
    out_L: np.ndarray  # boundary activation bytes per device (the layer's output)
    costs: list  # LayerCost per layer
    tied: float  # tied embedding parameters per device (nest.costs.memory)
    # [b, a] range tables: sums (maxima for work / maxpar) over layers a..b
    pd_LL: np.ndarray = None
    pe_LL: np.ndarray = None
    comp_LLR: np.ndarray = None
    act_LLR: np.ndarray = None
    work_LLR: np.ndarray = None
    maxpar_LL: np.ndarray = None
    cum: dict = field(default_factory=dict)  # prefix sums for one-cell breakdowns
    group_cache: OrderedDict = field(default_factory=OrderedDict)

    @property
    def num_layers(self) -> int:
        return len(self.dense_L)

    @property
    def comp_LR(self) -> np.ndarray:
        return (self.fwd_L + self.bwd_L)[:, None] + self.rec_LR


def layer_table(problem, v: Variant, modes: tuple[str, ...]) -> LayerTable:
    """The variant's table (cached on the problem; the problem must hold the variant)."""
    key = ("layer_table", v, tuple(modes))
    cache = problem_cache(problem)
    if key in cache:
        return cache[key]
    g = problem.graph
    if not problem.has_variant(v):
        raise KeyError(f"the problem's layer graph has no variant {v.key}: "
                       f"use problem.with_variants([...]) first")
    costs = [la.costs[v.key] for la in g.layers]
    times = [problem.costs.times(i, v.key) for i in range(g.num_layers)]
    lt = LayerTable(
        v, tuple(modes), np.array([t.fwd_s for t in times]), np.array([t.bwd_s for t in times]),
        np.array([[t.recompute_s[r] for r in modes] for t in times]),
        np.array([[c.act_bytes[r] for r in modes] for c in costs]),
        np.array([[c.act_bytes["none"] - c.act_bytes[r] for r in modes] for c in costs]),
        np.array([c.dense_params for c in costs]), np.array([c.expert_params for c in costs]),
        np.array([c.output_bytes for c in costs]), costs,
        tied_embedding_params(problem.model, g, v.tp))
    L = g.num_layers
    lt.pd_LL = range_sum(lt.dense_L)
    lt.pd_LL[L - 1, 0] -= lt.tied  # one stage holding embedding and head keeps one copy
    lt.pe_LL = range_sum(lt.expert_L)
    lt.comp_LLR = range_sum(lt.comp_LR)
    lt.act_LLR = range_sum(lt.act_LR)
    lt.work_LLR = range_max(lt.work_LR)
    lt.maxpar_LL = range_max(lt.dense_L + lt.expert_L)
    for name in ("fwd_L", "bwd_L", "rec_LR"):
        lt.cum[name] = prefix(getattr(lt, name))
    cache[key] = lt
    return lt


def problem_cache(problem) -> dict:
    """A per-problem cache dict (problems are frozen and never change, so entries stay valid)."""
    c = problem.__dict__.get("_kernel_cache")
    if c is None:
        c = {}
        object.__setattr__(problem, "_kernel_cache", c)
    return c


def prefix(x_L: np.ndarray) -> np.ndarray:
    return np.concatenate([np.zeros((1,) + x_L.shape[1:]), np.cumsum(x_L, axis=0)])


def range_sum(x_L: np.ndarray) -> np.ndarray:
    """S[b, a] = sum x[a..b] (valid for a <= b)."""
    c = prefix(x_L)
    return c[1:, None] - c[None, :-1]


def range_max(x_L: np.ndarray) -> np.ndarray:
    """M[b, a] = max x[a..b] (valid for a <= b); x may carry trailing axes."""
    n = x_L.shape[0]
    out = np.zeros((n, n) + x_L.shape[1:])  # a > b cells are masked later; values >= 0
    for a in range(n):
        out[a:, a] = np.maximum.accumulate(x_L[a:], axis=0)
    return out


# --------------------------------------------------------------------------------------------
# Device groups of a stage
# --------------------------------------------------------------------------------------------


def inner_groups(ids, tp: int, cp: int, ep: int, dp: int) -> dict[str, np.ndarray]:
    """tp / cp / ep groups of every replica, and the data-parallel groups of the stage, as 2-D
    arrays (one group per row). Replica r holds ids[r*w:(r+1)*w], inner rank = (e*cp + c)*tp + t:
    dense weights are replicated over the dp, ep and cp ranks; experts over dp and cp ranks."""
    a = np.asarray(ids).reshape(dp, ep, cp, tp)
    return {
        "tp": a.reshape(-1, tp),
        "cp": a.transpose(0, 1, 3, 2).reshape(-1, cp),
        "ep": a.transpose(0, 2, 3, 1).reshape(-1, ep),
        "dp_dense": a.transpose(3, 0, 1, 2).reshape(tp, -1),
        "dp_expert": a.transpose(3, 1, 0, 2).reshape(tp * ep, -1),
    }


def level_name(cluster, group) -> str:
    lvl = span_level(cluster, tuple(int(x) for x in group))
    return cluster.levels[lvl].name if lvl >= 0 else "local"


@dataclass
class GroupTerms:
    """What a stage's device set decides: its variant collectives per layer (K named terms) and
    the alpha-beta lines of its data-parallel groups."""

    names: list[str]  # "<group>_<kind>.<level>"
    fwd_K: np.ndarray  # bool: the term runs in the forward pass
    cum_LK: np.ndarray  # prefix sums over layers, [L + 1, K]
    cum_LR: np.ndarray  # prefix sums of the total per recompute mode (full re-runs fwd terms)
    dp_lines: dict  # {"dense" | "expert": {kind: lines per distinct group}}
    dp_level: str
    grid: dict = field(default_factory=dict)  # stage_cost's [b, a] terms per (d, options)


def group_terms(problem, lt: LayerTable, ids, d: int) -> GroupTerms:
    cl, v = problem.cluster, lt.variant
    key = (d, shifted(cl, ids))
    hit = lt.group_cache.get(key)
    if hit is not None:
        lt.group_cache.move_to_end(key)
        return hit
    groups = inner_groups(ids, v.tp, v.cp, v.ep, d)
    lines: dict = {}

    def time(kind: str, name: str, nbytes: float) -> float:
        if (kind, name) not in lines:
            lines[(kind, name)] = group_lines(cl, kind, groups[name])
        return float(lines_time(lines[(kind, name)], nbytes))

    names: list[str] = []
    fwd: list[bool] = []
    col_of: dict[tuple, int] = {}
    rows: dict[int, list[tuple[int, float]]] = {}
    for c in lt.costs:
        if id(c) in rows:
            continue
        row = []
        for col in c.collectives:
            x = time(col.kind, col.group, col.bytes) * col.count
            if not x:
                continue
            name = f"{col.group}_{col.kind}.{level_name(cl, groups[col.group][0])}"
            k = col_of.setdefault((name, col.phase == "fwd"), len(names))
            if k == len(names):
                names.append(name)
                fwd.append(col.phase == "fwd")
            row.append((k, x))
        rows[id(c)] = row
    L, K = lt.num_layers, len(names)
    x_LK = np.zeros((L, K))
    for li, c in enumerate(lt.costs):
        for k, x in rows[id(c)]:
            x_LK[li, k] += x
    fwd_K = np.array(fwd, dtype=bool)
    full_R = np.array([r == "full" for r in lt.modes])
    total_L = x_LK.sum(axis=1)
    fwd_L = x_LK[:, fwd_K].sum(axis=1) if K else np.zeros(L)
    tot_LR = total_L[:, None] + np.where(full_R, fwd_L[:, None], 0.0)
    dp, dp_level = dp_lines(problem, lt, ids, d, groups)
    out = GroupTerms(names, fwd_K, prefix(x_LK), prefix(tot_LR), dp, dp_level)
    lt.group_cache[key] = out
    if len(lt.group_cache) > GROUP_CACHE_ENTRIES:
        lt.group_cache.popitem(last=False)
    return out


# --------------------------------------------------------------------------------------------
# The ZeRO schedule and the stage kernel
# --------------------------------------------------------------------------------------------


def dp_lines(problem, lt: LayerTable, ids, d: int, groups=None):
    """Alpha-beta lines of a stage's data-parallel groups ({"dense" | "expert": {kind: lines}})
    and the level name of its dense group (cached per (d, shifted ids))."""
    cl, v = problem.cluster, lt.variant
    key = ("dp", d, shifted(cl, ids))
    hit = lt.group_cache.get(key)
    if hit is not None:
        return hit
    if groups is None:
        groups = inner_groups(ids, v.tp, v.cp, v.ep, d)
    dp = {part: group_lines_by_kind(cl, SYNC_KINDS, groups["dp_" + part])
          for part in ("dense", "expert")}
    dg = groups["dp_dense"]
    out = lt.group_cache[key] = (dp, level_name(cl, dg[0]) if dg.shape[1] > 1 else "local")
    if len(lt.group_cache) > GROUP_CACHE_ENTRIES:
        lt.group_cache.popitem(last=False)
    return out


def zero_schedule(z: int, coll) -> tuple[dict, dict]:
    """The collectives ZeRO stage z adds (Rajbhandari et al. 2020, section 5; DeepSpeed behaviour
    with gradient accumulation), as ({per micro-batch}, {gradient sync after the flush}).
    `coll(kind, bytes_per_param)` prices a collective of the stage's parameters over its
    data-parallel groups (any callable: exact lines, Alpa's per-byte slopes, arrays).
      z = 0: sync all-reduce of the gradients
      z = 1: sync reduce-scatter of the gradients + all-gather of the updated weights
      z = 2: per micro-batch reduce-scatter of the gradients; sync all-gather of the weights
      z = 3: per micro-batch reduce-scatter, and all-gather of the weights before the forward
             and again before the backward; nothing after the flush"""
    per_mb: dict = {}
    sync: dict = {}
    if z >= 2:
        per_mb["zero_reduce_scatter"] = coll("reduce_scatter", "grad")
    if z == 3:
        per_mb["zero3_all_gather.fwd"] = coll("all_gather", "weight")
        per_mb["zero3_all_gather.bwd"] = coll("all_gather", "weight")
    if z == 0:
        sync["all_reduce"] = coll("all_reduce", "grad")
    elif z == 1:
        sync["reduce_scatter"] = coll("reduce_scatter", "grad")
    if z in (1, 2):
        sync["all_gather"] = coll("all_gather", "weight")
    return per_mb, sync


def bytes_per_param(training, which: str) -> int:
    return training.grad_bytes_per_param if which == "grad" else training.weight_bytes_per_param


@dataclass
class StageCost:
    """Arrays over the cells (a scalar cell: shape ()), then Z and/or R."""

    t: np.ndarray  # [..., Z, R] time per micro-batch
    u: np.ndarray  # [..., Z] gradient sync + optimizer step + tied-embedding all-reduce
    mem: np.ndarray  # [..., Z, R] peak bytes
    detail: dict | None = None  # one cell: the per-term breakdown (see `stage_cost`)


def tied_sync_s(problem, lt: LayerTable, ids, partner) -> float:
    """Megatron's embedding group: the first and last stage all-reduce the tied word embedding's
    gradient, device by device (0 for untied models or a single stage)."""
    if not lt.tied or partner is None:
        return 0.0
    emb = problem.training.grad_bytes_per_param * lt.tied
    return _pairwise_all_reduce(problem.cluster, tuple(ids), tuple(partner), emb)


@lru_cache(maxsize=4096)
def _pairwise_all_reduce(cluster, ids: tuple, partner: tuple, nbytes: float) -> float:
    return max(collective_time(cluster, "all_reduce", (a, b), nbytes)
               for a, b in pairs(ids, partner))


def stage_cost(problem, lt: LayerTable, ids, d: int, opts: Options, stash, *,
               cell: tuple[int, int] | None = None, next_stage=None, prev_stage=None,
               tied_partner=None, detail: bool = False) -> StageCost:
    """Price a stage. `cell` = (first_layer, last_layer) for one stage, None for the whole [b, a]
    grid. next_stage / prev_stage: (LayerTable, ids) of the neighbours (None at the ends); each
    transfer carries the sending stage's own per-device boundary tensor (its output forward, the
    gradient of its input backward, in its own variant's layout) over
    `nest.network.collectives.pairs`; a receiver of another variant re-lays it out locally
    (not priced), so a stage's time depends only on its own variant and its neighbours' devices. tied_partner: ids of the stage at the other end of the
    pipeline for the first and last stage of a tied model. `stash` may be an array over cells.
    detail (one cell only): the breakdown the evaluator reports."""
    cl, hw, L = problem.cluster, problem.cluster.hardware, lt.num_layers
    gt = group_terms(problem, lt, ids, d)
    if cell is None:
        b, a = np.arange(L)[:, None], np.arange(L)[None, :]
        key = ("grid", d, opts)
        terms = gt.grid.get(key)
        if terms is None:
            terms = gt.grid[key] = _terms(problem, lt, gt, d, opts, None)
    else:
        a, b = cell
        terms = _terms(problem, lt, gt, d, opts, (b, a))
    base_R, per_mb_Z, sync_Z, fixed_ZR, act_R, parts = terms
    send = 0.0
    send_fwd = send_bwd = 0.0
    if next_stage is not None:
        _, nids = next_stage
        send_fwd = send_time(cl, ids, nids, lt.out_L[b])
        send = send + send_fwd
    if prev_stage is not None:  # the gradient of layer a-1's output, back to the previous stage
        _, pids = prev_stage
        prev_out = np.concatenate([[0.0], lt.out_L[:-1]])
        send_bwd = send_time(cl, ids, pids, prev_out[a])
        send = send + send_bwd
    tied = tied_sync_s(problem, lt, ids, tied_partner)
    t = base_R[..., None, :] + per_mb_Z[..., None] + np.asarray(send)[..., None, None]
    u = sync_Z + tied
    stash = np.asarray(stash, dtype=float)
    mem = peak(fixed_ZR + (stash[..., None] * act_R)[..., None, :], hw)
    out = StageCost(t, u, mem)
    if detail:
        assert cell is not None, "a breakdown is for one cell"
        out.detail = _detail(problem, lt, gt, d, opts, stash, a, b, parts, float(send_fwd),
                             float(send_bwd), tied)
    return out


def fixed_bytes(problem, lt: LayerTable, d: int, opts: Options, cell=None):
    """Memory of a stage that does not depend on its pipeline position, allocated bytes per
    [..., z, r]: ZeRO-sharded states and the recomputation working set (nest.costs.memory)."""
    tr, v = problem.training, lt.variant
    take, ri = _indexer(lt, opts, cell)
    pd, pe = take(lt.pd_LL), take(lt.pe_LL)
    rows = []
    for z in opts.zero_stages:
        states = sum(state_bytes(pd, pe, d, v.ep, v.cp, z, tr).values())
        work = working_bytes(take(lt.work_LLR)[..., ri], take(lt.maxpar_LL)[..., None], z, tr)
        rows.append(np.asarray(states)[..., None] + work)
    return np.stack(rows, axis=-2)


def _indexer(lt: LayerTable, opts: Options, cell):
    ri = [lt.modes.index(r) for r in opts.recompute_modes]  # the table's modes -> the options'
    if ri == list(range(len(lt.modes))):
        ri = slice(None)
    if cell is None:
        return (lambda x: x), ri
    b, a = cell
    return (lambda x: x[b, a]), ri


def _terms(problem, lt: LayerTable, gt: GroupTerms, d: int, opts: Options, cell):
    """The parts of a stage that do not depend on its neighbours or position."""
    tr, hw, v = problem.training, problem.cluster.hardware, lt.variant
    take, ri = _indexer(lt, opts, cell)
    b, a = cell if cell is not None else (np.arange(lt.num_layers)[:, None],
                                          np.arange(lt.num_layers)[None, :])
    pd, pe = take(lt.pd_LL), take(lt.pe_LL)
    base_R = take(lt.comp_LLR)[..., ri] + (gt.cum_LR[b + 1] - gt.cum_LR[a])[..., ri]

    def coll(kind: str, which: str):
        n = bytes_per_param(tr, which)
        return (lines_time(gt.dp_lines["dense"][kind], n * pd)
                + lines_time(gt.dp_lines["expert"][kind], n * pe))

    per_mb_Z, sync_Z, parts = [], [], {}
    zero = np.zeros_like(np.asarray(pd, dtype=float))
    for z in opts.zero_stages:
        pm, sy = parts[z] = zero_schedule(z, coll)
        per_mb_Z.append(sum(pm.values(), zero))
        sync_Z.append(sum(sy.values(), zero)
                      + optimizer_step_s(per_device(pd, pe, d, v.ep, v.cp, z >= 1), tr, hw))
    fixed = fixed_bytes(problem, lt, d, opts, cell)
    return (base_R, np.stack(per_mb_Z, axis=-1), np.stack(sync_Z, axis=-1), fixed,
            take(lt.act_LLR)[..., ri], parts)


def _detail(problem, lt, gt, d, opts, stash, a, b, parts, send_fwd, send_bwd, tied):
    """Per-term breakdown of one cell with one option (opts must hold one z and one r)."""
    tr, hw, v = problem.training, problem.cluster.hardware, lt.variant
    pd, pe = lt.pd_LL[b, a], lt.pe_LL[b, a]
    assert len(opts.zero_stages) == 1 and len(opts.recompute_modes) == 1
    z, r = opts.zero_stages[0], opts.recompute_modes[0]
    ri = lt.modes.index(r)
    bd: dict[str, float] = {}
    fwd = 0.0

    def add(k: str, x, forward: bool = False) -> None:
        nonlocal fwd
        x = float(x)
        if x:
            bd[k] = bd.get(k, 0.0) + x
            fwd += x if forward else 0.0

    def rng(name):
        c = lt.cum[name]
        return c[b + 1] - c[a]

    add("compute_fwd", rng("fwd_L"), forward=True)
    add("compute_bwd", rng("bwd_L"))
    add("recompute", rng("rec_LR")[ri])
    terms = gt.cum_LK[b + 1] - gt.cum_LK[a]
    for name, is_fwd, x in zip(gt.names, gt.fwd_K, terms):
        add(name, x, forward=bool(is_fwd))
        if is_fwd and r == "full":
            add(f"recompute_{name}", x)
    pm, sy = parts[z]
    for k, x in pm.items():
        add(k.removesuffix(".fwd").removesuffix(".bwd"), x, forward=k.endswith(".fwd"))
    add("p2p_fwd", send_fwd)
    add("p2p_bwd", send_bwd)
    sync = {f"{k}.{gt.dp_level}": float(x) for k, x in sy.items() if float(x)}
    if tied:
        sync["tied_embedding_all_reduce"] = tied
    mem = {k: float(x) for k, x in state_bytes(pd, pe, d, v.ep, v.cp, z, tr).items()}
    mem["activations"] = float(stash * lt.act_LLR[b, a, ri])
    mem["working"] = float(working_bytes(lt.work_LLR[b, a, ri], lt.maxpar_LL[b, a], z, tr))
    mem = with_overheads(mem, hw)
    rec = sum(x for k, x in bd.items() if k.startswith("recompute"))
    return {"breakdown_s": bd, "fwd_s": fwd, "sync_breakdown_s": sync,
            "optimizer_s": float(optimizer_step_s(per_device(pd, pe, d, v.ep, v.cp, z >= 1),
                                                  tr, hw)),
            "memory_bytes": mem, "send_fwd_s": send_fwd, "send_bwd_s": send_bwd,
            "recompute_s": rec, "num_params": float(pd + pe)}
