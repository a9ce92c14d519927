"""Layers a..b x device ids x (ZeRO, recompute) -> time, tail and memory: the one stage kernel.

Every planner, bound and message prices a pipeline stage here; the evaluator is one cell of it.
A stage covers layers a..b of one sub-graph variant on `ids` (replica by replica, nest.problem.plan), with
d data-parallel replicas, at a pipeline position that stashes `stash` micro-batches:
    t[z, r] = compute_fwd + compute_bwd + recompute[r]            (nest.costs.roofline)
            + the variant's collectives on the stage's groups     (+ forward ones again, r = full)
            + ZeRO's per-micro-batch collectives[z]               (`zero_schedule`)
            + send of the output to the next stage, of the input gradient to the previous one
    u[z]    = gradient sync[z] (`zero_schedule`; with param_gather_overlap only the exposed part
              of the weights' all-gather, `gather_exposed`) + optimizer step (HBM-bound)
            + the tied-embedding all-reduce of the first and last stage
    mem[z, r] = peak of weights, gradients, optimizer states (ZeRO-sharded), stash * activations
            and the working set (nest.costs.memory)
`stage_cost` evaluates it on one cell (a, b) or on the whole [b, a] grid of every cut at once
(the same arithmetic, NumPy broadcasting); `Options` is the one encoding of the per-stage knobs
(o = z_index * R + r_index). Its parts: nest.costs.layers (per-layer vectors and range tables),
nest.costs.groups (device groups and their collectives), nest.costs.memory (the memory model). Legend: L layers (b: last, a: first), K collective terms,
Z ZeRO stages, R recomputation modes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from nest.costs.cache import read_only
from nest.costs.groups import GroupTerms, group_terms
from nest.costs.layers import LayerTable
from nest.costs.memory import (optimizer_step_for, peak, resident_and_step, state_bytes,
                               with_overheads, working_bytes)
from nest.costs.pipeline import held_bytes
from nest.network.collectives import lines_time, pair_ids, send_time, worst
from nest.costs.pipeline import dp_sync_exposed_s


@dataclass(frozen=True)
class Options:
    """The per-stage knobs a planner chooses, encoded o = z_index * R + r_index."""

    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    recompute_modes: tuple[str, ...] = ("none", "selective", "full")

    @property
    def size(self) -> int:
        return len(self.zero_stages) * len(self.recompute_modes)

    def decode(self, o: int) -> tuple[int, str]:
        R = len(self.recompute_modes)
        return self.zero_stages[o // R], self.recompute_modes[o % R]

    def per_option(self, x_Z: np.ndarray) -> np.ndarray:
        """An array over ZeRO stages (last axis) spread over the options (last axis O)."""
        return np.repeat(x_Z, len(self.recompute_modes), axis=-1)


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


def zero_costs(z: int, coll, training, fwd_s=None, num_params=None) -> tuple[dict, dict]:
    """`zero_schedule` under the training settings: with param_gather_overlap the weights'
    all-gather after the step becomes its part the next forward (fwd_s) cannot hide
    (`gather_exposed`, in the stage's buckets of num_params)."""
    pm, sy = zero_schedule(z, coll)
    if training.param_gather_overlap and "all_gather" in sy:
        sy["all_gather_exposed"] = gather_exposed(sy.pop("all_gather"), fwd_s,
                                                  buckets(num_params, training))
    return pm, sy


def buckets(num_params, training):
    """Gradient / parameter buckets of a stage: ceil(parameters / dp_bucket_params), at least 1
    (Megatron-LM's DDP buckets; the evaluator's and the stage kernel's one count)."""
    return np.maximum(np.ceil(np.asarray(num_params, dtype=float) / training.dp_bucket_params),
                      1.0)


def forward_collectives_s(gt: GroupTerms, a, b):
    """The forward collectives of layers a..b per micro-batch (what full recomputation re-runs)."""
    return (gt.cum_LK[b + 1] - gt.cum_LK[a])[..., gt.fwd_K].sum(axis=-1)


def forward_s(lt: LayerTable, gt: GroupTerms, a, b):
    """A stage's forward time per micro-batch: compute plus forward collectives (no sends)."""
    return lt.cum["fwd_L"][b + 1] - lt.cum["fwd_L"][a] + forward_collectives_s(gt, a, b)


def gather_exposed(gather_s, window_s, num_buckets):
    """What the next batch's first forward cannot hide of the weights' all-gather (training
    setting param_gather_overlap; Megatron-LM --overlap-param-gather): the k buckets go out one
    after another, bucket i is needed i / k of the way through the forward window W, so the
    forward waits S / k for the first and S - W (k - 1) / k in all when the network is slower
    than the forward: nest.costs.pipeline.dp_sync_exposed_s read backwards, S / k + max(0, S - W)
    (k - 1) / k. Any upstream pipeline fill before the stage's first forward is not counted
    (an upper bound, exact for the first stage)."""
    return dp_sync_exposed_s(gather_s, window_s, num_buckets)


def bytes_per_param(training, which: str) -> int:
    """Bytes per parameter a ZeRO collective moves: gradients in the reduce dtype, weights in
    the gathered dtype (FP8 with fp8_param_gather; nest.spec.precision)."""
    return (training.grad_bytes_per_param if which == "grad"
            else training.precision.gather_bytes)


@dataclass
class StageCost:
    """Arrays over the cells (a scalar cell: shape ()), then Z and/or R."""

    t: np.ndarray  # [..., Z, R] time per micro-batch
    u: np.ndarray  # [..., Z] gradient sync + optimizer step + tied-embedding all-reduce
    mem: np.ndarray  # [..., Z, R] peak bytes
    detail: dict | None = None  # one cell: the per-term breakdown (see `stage_cost`)
    # dp_overlap stage | bucketed only (`overlap_terms`), [..., Z, R]: the stage's own tail after
    # its last backward, and its backward busy time the later stages' syncs hide under
    tail: np.ndarray | None = None
    drain: np.ndarray | None = None
    # the pipeline sends inside t, [...] over the cells: of the output forward, of the input's
    # gradient backward (0 at the ends)
    send_fwd: np.ndarray | float = 0.0
    send_bwd: np.ndarray | float = 0.0


def tied_sync_s(problem, lt: LayerTable, ids, partner) -> float:
    """Megatron's embedding group: the first and last stage all-reduce the tied word embedding's
    gradient, device by device (0 for untied models or a single stage)."""
    if not lt.tied or partner is None:
        return 0.0
    emb = problem.training.grad_bytes_per_param * lt.tied
    return _pairwise_all_reduce(problem.cluster, tuple(ids), tuple(partner), emb)


@lru_cache(maxsize=4096)
def _pairwise_all_reduce(cluster, ids: tuple, partner: tuple, nbytes: float) -> float:
    """All pairs at once: the slowest distinct pair shape (nest.network.collectives.worst)."""
    return worst(cluster, "all_reduce", pair_ids(ids, partner), nbytes)


def stage_cost(problem, lt: LayerTable, ids, d: int, opts: Options, stash, *,
               cell: tuple[int, int] | None = None, next_ids=None, prev_ids=None,
               tied_partner=None, detail: bool = False, from_grid: bool = False,
               gt: GroupTerms | None = None, terms: tuple | None = None) -> StageCost:
    """Price a stage. `cell` = (first_layer, last_layer) for one stage, None for the whole [b, a]
    grid. next_ids / prev_ids: the neighbours' devices (None at the ends); each transfer carries
    the sending stage's own per-device boundary tensor (its output forward, the gradient of its
    input backward, in its own variant's layout) over `nest.network.collectives.pair_ids`; a
    receiver of another variant re-lays it out locally (not priced), so a stage's time depends
    only on its own variant and its neighbours' devices. tied_partner: ids of the stage at the
    other end of the pipeline for the first and last stage of a tied model. `stash` may be an
    array over cells. detail (one cell only): the breakdown the evaluator reports. from_grid:
    read the cells' position-free terms from the whole grid's, cached per (d, group terms'
    content, options): for callers pricing many cells of many stages
    that sit alike (the solver's joint bound); the same values as pricing the cells directly.
    gt: the stage's group terms when the caller holds them (nest.costs.groups.group_terms or
    placement_group_terms of these ids and d, the same entry), else looked up here. terms (one
    cell, priced directly): its position-free terms when the caller holds them (`cell_terms` of
    the same lt, gt, d, opts and cell: the object this function would compute), else computed
    here."""
    cl, hw, L = problem.cluster, problem.cluster.hardware, lt.num_layers
    if gt is None:
        gt = group_terms(problem, lt, ids, d)
    if cell is None or from_grid:
        terms = grid_terms(problem, lt, gt, d, opts)
    if cell is None:
        b, a = np.arange(L)[:, None], np.arange(L)[None, :]
    elif from_grid:  # the cells' entries of the grid: the same elementwise arithmetic
        assert not detail, "a breakdown is for one cell, priced directly"
        a, b = cell
        base_R, per_mb_Z, sync_Z, fixed_ZR, act_R, _, ov, step_Z = terms  # parts: breakdown only
        terms = _cells((base_R, per_mb_Z, sync_Z, fixed_ZR, act_R, None, ov, step_Z), L, b, a)
    else:
        a, b = cell
        if terms is None:
            terms = cell_terms(problem, lt, gt, d, opts, cell)
    base_R, per_mb_Z, sync_Z, fixed_ZR, act_R, parts, ov, step_Z = terms
    send = 0.0
    send_fwd = send_bwd = 0.0
    if next_ids is not None:
        send_fwd = send_time(cl, ids, next_ids, lt.out_L[b])
        send = send + send_fwd
    if prev_ids is not None:  # the gradient of layer a-1's output, back to the previous stage
        prev_out = np.concatenate([[0.0], lt.out_L[:-1]])
        send_bwd = send_time(cl, ids, prev_ids, prev_out[a])
        send = send + send_bwd
    tied = tied_sync_s(problem, lt, ids, tied_partner)
    t = base_R[..., None, :] + per_mb_Z[..., None] + np.asarray(send)[..., None, None]
    u = sync_Z + tied
    stash = np.asarray(stash, dtype=float)
    mem = peak(held_bytes(fixed_ZR, stash[..., None, None], act_R[..., None, :], step_Z), hw)
    out = StageCost(t, u, mem, send_fwd=send_fwd, send_bwd=send_bwd)
    if ov is not None:
        out.tail, out.drain = overlap_terms(problem, ov, base_R, per_mb_Z, send_bwd, tied)
    if detail:
        assert cell is not None, "a breakdown is for one cell"
        out.detail = _detail(problem, lt, gt, d, opts, stash, a, b, parts, float(send_fwd),
                             float(send_bwd), tied)
    return out


def cell_terms(problem, lt: LayerTable, gt: GroupTerms, d: int, opts: Options, cell) -> tuple:
    """The position-free terms of one stage cell (first layer, last layer) (`_terms`): what
    stage_cost prices a cell from before its sends, stash and tied sync; a caller pricing the
    same cell at many positions may keep them and hand them back (stage_cost's `terms`)."""
    a, b = cell
    return _terms(problem, lt, gt, d, opts, (b, a))


def grid_terms(problem, lt: LayerTable, gt: GroupTerms, d: int, opts: Options) -> tuple:
    """The position-free terms of a stage on the whole [b, a] grid (base_R, per_mb_Z, sync_Z,
    fixed_ZR, act_R, parts, overlap terms or None, step_Z1: `_terms`), cached per (d, group terms'
    content, options): every stage whose group terms are equal shares them."""
    return problem.cache.get(lt.store, ("grid", d, gt.content, opts),
                             lambda: read_only(_grid_columns(problem, lt, gt, d, opts)))


def _grid_columns(problem, lt: LayerTable, gt: GroupTerms, d: int, opts: Options) -> tuple:
    """`_terms` on the whole grid. For a table of some modes whose group terms are the
    all-modes terms' columns (nest.costs.groups), with the options' modes the table's: the
    columns of the all-modes table's grid under the same ZeRO stages and every mode, kept in
    its store. `_terms` computes every per-mode array elementwise from the table's and the
    group terms' columns, so these are the floats it gives the table and options themselves
    (tests/test_placement_floors.py), and the searches of one (ZeRO stage, mode) each share
    one grid per ZeRO stage. (Not across ZeRO stages: a search per ZeRO stage visits too few
    of the same (d, groups) to pay for the other stages' arrays.)"""
    from nest.costs.layers import ALL_MODES, layer_table, subset_of_all

    if gt.full is None or subset_of_all(lt.modes) is None or opts.recompute_modes != lt.modes:
        return _terms(problem, lt, gt, d, opts, None)
    every = Options(opts.zero_stages, ALL_MODES)
    full = grid_terms(problem, layer_table(problem, lt.variant, ALL_MODES), gt.full, d, every)
    ri = [ALL_MODES.index(r) for r in lt.modes]
    base_R, per_mb_Z, sync_Z, fixed_ZR, act_R, parts, ov, step_Z = full
    if ov is not None:
        ov = {**ov, "rec_R": ov["rec_R"][..., ri]}
    return (base_R[..., ri], per_mb_Z, sync_Z, fixed_ZR[..., ri], act_R[..., ri], parts, ov,
            step_Z)


def _cells(terms, L: int, b, a):
    """The [b, a] entries of whole-grid terms (every array whose leading axes are the [L, L]
    grid; anything else, a per-stage constant, as is)."""
    def pick(x):
        if isinstance(x, Mapping):
            return {k: pick(v) for k, v in x.items()}
        if isinstance(x, tuple):
            return tuple(pick(v) for v in x)
        if isinstance(x, np.ndarray) and x.shape[:2] == (L, L):
            return x[b, a]
        return x
    return pick(terms)


def fixed_bytes(problem, lt: LayerTable, d: int, opts: Options, cell=None):
    """Memory of a stage that does not depend on its pipeline position, allocated bytes per
    [..., z, r]: resident ZeRO-sharded states and the recomputation working set
    (nest.costs.memory)."""
    return fixed_and_step_bytes(problem, lt, d, opts, cell)[0]


def fixed_and_step_bytes(problem, lt: LayerTable, d: int, opts: Options, cell=None):
    """(`fixed_bytes` [..., z, r], step [..., z, 1]): step is what the stage's optimizer step
    holds, its resident states plus the transient FP32 gradient copy
    (nest.costs.memory.resident_and_step); a stage allocates
    nest.costs.pipeline.held_bytes(fixed, stash, act, step)."""
    tr, v = problem.training, lt.variant
    take, ri = _indexer(lt, opts, cell)
    pd, pe = take(lt.pd_LL), take(lt.pe_LL)
    rows, steps = [], []
    for z in opts.zero_stages:
        states, step = resident_and_step(state_bytes(pd, pe, d, v.ep, v.cp, z, tr,
                                                     take(lt.fp8_LL)))
        work = working_bytes(take(lt.work_LLR)[..., ri], take(lt.maxpar_LL)[..., None], z, tr)
        rows.append(np.asarray(states)[..., None] + work)
        steps.append(np.asarray(step, dtype=float)[..., None])
    return np.stack(rows, axis=-2), np.stack(steps, axis=-2)


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
    fwd = None  # the stage's forward per micro-batch, computed when a term needs it
    if tr.param_gather_overlap or tr.dp_overlap != "none":
        fwd = forward_s(lt, gt, a, b)
    for z in opts.zero_stages:
        pm, sy = parts[z] = zero_costs(z, coll, tr, fwd, pd + pe)
        per_mb_Z.append(sum(pm.values(), zero))
        sync_Z.append(sum(sy.values(), zero)
                      + optimizer_step_for(pd, pe, d, v.ep, v.cp, z, tr, hw))
    fixed, step = (fixed_and_step_bytes(problem, lt, d, opts, cell) if cell is not None else
                   problem.cache.get(lt.store, ("fixed", d, opts), lambda: read_only(  # position-
                       fixed_and_step_bytes(problem, lt, d, opts))))  # free
    ov = None
    if tr.dp_overlap != "none":  # the parts the overlapped tail needs (`overlap_terms`)
        fcoll = forward_collectives_s(gt, a, b)
        full = np.array([r == "full" for r in opts.recompute_modes], dtype=float)
        ov = {"fwd_Z": np.stack([fwd + parts[z][0].get("zero3_all_gather.fwd", zero)
                                 for z in opts.zero_stages], axis=-1),
              "rec_R": (lt.cum["rec_LR"][b + 1] - lt.cum["rec_LR"][a])[..., ri]
              + np.asarray(fcoll)[..., None] * full,
              "grad_Z": np.stack([sum((x for k, x in parts[z][1].items()
                                       if not k.startswith("all_gather")), zero)
                                  for z in opts.zero_stages], axis=-1),
              "buckets": buckets(pd + pe, tr)}
        ov["after_Z"] = np.stack(sync_Z, axis=-1) - ov["grad_Z"]  # optimizer + all-gather
    return (base_R, np.stack(per_mb_Z, axis=-1), np.stack(sync_Z, axis=-1), fixed,
            take(lt.act_LLR)[..., ri], parts, ov, step)


def overlap_terms(problem, ov: dict, base_R, per_mb_Z, send_bwd, tied):
    """The tail of the overlapped gradient sync (training setting dp_overlap: stage | bucketed)
    per cell and option, as nest.costs.pipeline.dp_sync_tail_s prices it for a plan, split so that
    the solver can optimise it exactly (nest.solver.overlap):
        tail[z, r]  = e: what stage j adds after its own last backward (its gradient sync,
                      exposed under that backward in buckets for "bucketed", minus its own
                      backward send; then the optimizer step and ZeRO-1/2's all-gather)
        drain[z, r] = B + sb: its backward busy time per micro-batch, which every later
                      stage's sync may hide under (D_j = sum_{k<j} drain_k)
    so the evaluator's tail is max(0, max_j (tail_j - D_j))."""
    sb = np.asarray(send_bwd, dtype=float)[..., None, None]
    B = base_R[..., None, :] + (per_mb_Z - ov["fwd_Z"])[..., None]  # backward incl. recompute
    S = (ov["grad_Z"] + tied)[..., None]
    if problem.training.dp_overlap == "bucketed":
        exposed = dp_sync_exposed_s(S, B - ov["rec_R"][..., None, :],
                                    np.asarray(ov["buckets"])[..., None, None]) - sb
    else:
        exposed = S + np.zeros_like(B)
    return exposed + ov["after_Z"][..., None], B + sb


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
    gather = float(sum(x for k, x in sy.items() if k.startswith("all_gather")))
    if tied:
        sync["tied_embedding_all_reduce"] = tied
    mem = stage_memory(problem, lt, d, z, r, stash, a, b)
    rec = sum(x for k, x in bd.items() if k.startswith("recompute"))
    return {"breakdown_s": bd, "fwd_s": fwd, "sync_breakdown_s": sync,
            "optimizer_s": float(optimizer_step_for(pd, pe, d, v.ep, v.cp, z, tr, hw)),
            "memory_bytes": mem, "send_fwd_s": send_fwd, "send_bwd_s": send_bwd,
            "recompute_s": rec, "num_params": float(pd + pe), "gather_s": gather}


def stage_memory(problem, lt: LayerTable, d: int, z: int, r: str, stash, a: int, b: int
                 ) -> dict:
    """The memory record of one cell under one option, bytes by part (overheads included): what
    the evaluator reports (`_detail`) and what screens plans by memory before they are priced
    (nest.solver.interleaved_screen, through `stage_memories`)."""
    return stage_memories(problem, lt, d, z, r, [stash], [a], [b])[0]


def stage_memories(problem, lt: LayerTable, d: int, z: int, r: str, stash_K, a_K, b_K
                   ) -> list[dict]:
    """`stage_memory` of several cells k (first layers a_K, last b_K, stashes stash_K) under one
    option at once: each part computed elementwise over the cells (the same arithmetic per
    cell as one cell alone), then one record per cell."""
    tr, v = problem.training, lt.variant
    ri = lt.modes.index(r)
    a, b = np.asarray(a_K, dtype=np.int64), np.asarray(b_K, dtype=np.int64)
    pd, pe = lt.pd_LL[b, a], lt.pe_LL[b, a]
    parts = dict(state_bytes(pd, pe, d, v.ep, v.cp, z, tr, lt.fp8_LL[b, a]))
    parts["activations"] = np.asarray(stash_K, dtype=float) * lt.act_LLR[b, a, ri]
    parts["working"] = working_bytes(lt.work_LLR[b, a, ri], lt.maxpar_LL[b, a], z, tr)
    cols = {k: np.broadcast_to(np.asarray(x, dtype=float), a.shape).tolist()
            for k, x in parts.items()}
    hw = problem.cluster.hardware
    return [with_overheads({k: c[i] for k, c in cols.items()}, hw) for i in range(a.size)]
