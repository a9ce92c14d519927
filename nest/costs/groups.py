"""A stage's device ids -> what its tp / cp / ep / data-parallel groups cost.

Part of the stage kernel (nest.costs.stage): the variant's collectives per layer on the stage's
groups (named terms per network level), and the alpha-beta lines of its data-parallel groups,
kept in the problem's nest.costs.cache.ProblemCache per (d, `sits_alike` key of the ids) and,
coarser, per (d, `priced_alike` key) (nest.costs.alike): stages that sit alike in the
hierarchy, or whose groups price alike, share them, wherever they are.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from nest.costs.alike import (SYNC_KINDS, inner_groups, level_name, priced_alike,
                              priced_alike_keys, sits_alike)
from nest.common.errors import SpecError
from nest.costs.cache import read_only
from nest.costs.fp8_quant import AMAX_BYTES, amax_reductions
from nest.costs.layers import ALL_MODES, LayerTable, layer_table, prefix, subset_of_all
from nest.costs.roofline import streaming_s
from nest.network.collectives import group_lines, group_lines_by_kind, lines_time

__all__ = ["SYNC_KINDS", "GroupTerms", "group_terms", "inner_groups", "placement_group_terms",
           "sits_alike"]


@dataclass(frozen=True, eq=False)
class GroupTerms:
    """What a stage's device set decides: its variant collectives per layer (K named terms) and
    the alpha-beta lines of its data-parallel groups (every array read-only)."""

    names: tuple[str, ...]  # "<group>_<kind>.<level>"
    fwd_K: np.ndarray  # bool: the term runs in the forward pass
    cum_LK: np.ndarray  # prefix sums over layers, [L + 1, K]
    cum_LR: np.ndarray  # prefix sums of the total per recompute mode (full re-runs fwd terms)
    dp_lines: Mapping  # {"dense" | "expert": {kind: the groups' distinct lines, sorted}}
    dp_level: str
    layer_LR: np.ndarray  # per layer and recompute mode: the total (cum_LR's terms)
    fwd_L: np.ndarray  # per layer: its forward collectives
    # the all-modes table's terms these are columns of (`_terms_of`), None for those themselves
    full: GroupTerms | None = field(default=None, repr=False)

    @cached_property
    def content(self) -> bytes:
        """A digest of every value the stage terms read (nest.costs.stage._terms: cum_LK,
        fwd_K, cum_LR and the data-parallel lines, each kind's lines sorted: a collective costs
        its slowest group's, whatever their order): stages whose group terms are equal share
        their whole-grid terms, however differently they sit."""
        lines = sorted((part, kind, sorted(v)) for part, by in self.dp_lines.items()
                       for kind, v in by.items())
        h = hashlib.blake2b(digest_size=16)
        for x in (self.cum_LK, self.fwd_K, self.cum_LR):
            h.update(repr((x.shape, x.dtype.str)).encode() + x.tobytes())
        h.update(repr((self.names, lines)).encode())
        return h.digest()


def group_terms(problem, lt: LayerTable, ids, d: int) -> GroupTerms:
    """The stage's group terms, kept in the problem's cache per (d, `sits_alike` key) and, a
    level coarser, per (d, `priced_alike` key): a stage that sits unlike every earlier one but
    whose groups price the same shares their terms (GPT-3 on 16,128 NVL72 GPUs: 1,148 ways to
    sit, 136 priced)."""
    return problem.cache.get(alike_store(lt), ("group", d, sits_alike(problem.cluster, ids)),
                             lambda: _priced_alike_terms(problem, lt, ids, d))


def placement_group_terms(problem, lts, ids, d: int) -> list[list[GroupTerms]]:
    """`group_terms` of every stage position of a placement (ids: one device tuple per
    position, all of one size) for each layer table of `lts`, through their `priced_alike`
    keys computed at once (once per distinct tp, cp, ep); [per table][per position]."""
    out, by_shape = [], {}
    for lt in lts:
        v = lt.variant
        by_shape.setdefault((v.tp, v.cp, v.ep), []).append(lt)
    keys = {}
    arr = np.asarray(ids)
    digest = hashlib.blake2b(repr(arr.shape).encode() + arr.astype(np.int64).tobytes(),
                             digest_size=16).digest()
    for (tp, cp, ep), same in by_shape.items():
        # the keys read the variants' collectives, not their tables' modes: kept per variants,
        # d and ids, so the searches of one mode each share them
        found = problem.cache.get("priced_alike_keys", (tuple(lt.variant for lt in same), d,
                                                        digest), lambda same=same, tp=tp, cp=cp,
                                  ep=ep: priced_alike_keys(problem, same, inner_groups(
                                      arr, tp, cp, ep, d)))
        keys.update(zip(map(id, same), found))
    for lt in lts:  # positions of one key share one read (the first one's ids make a miss)
        memo: dict = {}
        out.append([memo[key] if key in memo else memo.setdefault(
            key, _terms_of(problem, lt, i, d, key)) for key, i in zip(keys[id(lt)], ids)])
    return out


def _terms_of(problem, lt: LayerTable, ids, d: int, key) -> GroupTerms:
    """The group terms of `priced_alike` key `key`, kept in lt's store. A table of some modes
    takes the all-modes table's terms with its modes' columns of cum_LR and layer_LR: every
    other field reads the variant's collectives alone, and those two are computed column by
    column (`_group_terms`: elementwise, then a cumulative sum down the layers), so they are
    the floats `_group_terms` gives the table itself (tests/test_placement_floors.py)."""
    idx = subset_of_all(lt.modes)
    if idx is None:
        return problem.cache.get(lt.store, ("group", d, key),
                                 lambda: _group_terms(problem, lt, ids, d))

    def columns() -> GroupTerms:
        full = _terms_of(problem, layer_table(problem, lt.variant, ALL_MODES), ids, d, key)
        return replace(full, cum_LR=read_only(full.cum_LR[:, idx]),
                       layer_LR=read_only(full.layer_LR[:, idx]), full=full)

    return problem.cache.get(lt.store, ("group", d, key), columns)


def alike_store(lt: LayerTable) -> tuple:
    """The cache store of the entries kept per `sits_alike` key (many, cheap to remake), apart
    from lt.store's grids so that they do not evict them."""
    return (*lt.store, "alike")


def _priced_alike_terms(problem, lt: LayerTable, ids, d: int) -> GroupTerms:
    v = lt.variant
    key = priced_alike(problem, lt, inner_groups(ids, v.tp, v.cp, v.ep, d))
    return _terms_of(problem, lt, ids, d, key)


def _group_terms(problem, lt: LayerTable, ids, d: int) -> GroupTerms:
    cl, v = problem.cluster, lt.variant
    groups = inner_groups(ids, v.tp, v.cp, v.ep, d)
    lines: dict = {}

    def time(kind: str, name: str, nbytes: float) -> float:
        if (kind, name) not in lines:
            lines[(kind, name)] = ep_lines(problem, groups[name]) \
                if (kind, name) == ("all_to_all", "ep") else group_lines(cl, kind, groups[name])
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
            x = time(col.kind, col.group, ep_a2a_bytes(problem.training, col)) * col.count
            if not x:
                continue
            name = f"{col.group}_{col.kind}.{level_name(cl, groups[col.group][0])}"
            row.append((column(name, col.phase == "fwd", names, fwd, col_of), x))
        row += amax_terms(problem, c, v, groups, time, names, fwd, col_of)
        row += routing_map_terms(problem, c, groups, time, names, fwd, col_of)
        rows[id(c)] = row
    L, K = lt.num_layers, len(names)
    x_LK = np.zeros((L, K))
    for li, c in enumerate(lt.costs):
        for k, x in rows[id(c)]:
            x_LK[li, k] += x
    fwd_K = np.array(fwd, dtype=bool)
    if problem.training.tp_comm_overlap and v.sp and v.tp > 1:
        tp_K = np.array([n.startswith("tp_") and not n.startswith(AMAX) for n in names])
        x_LK = tp_overlapped(x_LK, fwd_K, tp_K,
                             np.array([n.startswith("tp_reduce_scatter.") for n in names]), lt,
                             problem.training, cl.hardware)
    full_R = np.array([r == "full" for r in lt.modes])
    total_L = x_LK.sum(axis=1)
    fwd_L = x_LK[:, fwd_K].sum(axis=1) if K else np.zeros(L)
    tot_LR = total_L[:, None] + np.where(full_R, fwd_L[:, None], 0.0)
    dp, dp_level = dp_lines(problem, lt, ids, d, groups)
    return GroupTerms(tuple(names), read_only(fwd_K), read_only(prefix(x_LK)),
                      read_only(prefix(tot_LR)), dp, dp_level, read_only(tot_LR), read_only(fwd_L))


def column(name: str, is_fwd: bool, names: list, fwd: list, col_of: dict) -> int:
    """The column of term `name` in that phase among a layer table's group terms, appended to
    names / fwd (and col_of, its index) when new: `_group_terms`, amax_terms and
    routing_map_terms each register their terms so."""
    k = col_of.setdefault((name, is_fwd), len(names))
    if k == len(names):
        names.append(name)
        fwd.append(is_fwd)
    return k


AMAX = "tp_amax_all_reduce"  # the FP8 current-scaling amax all-reduces' term (amax_terms)


def amax_terms(problem, c, v, groups, time, names, fwd, col_of) -> list[tuple[int, float]]:
    """Transformer Engine's amax all-reduces of one layer under FP8 current scaling
    (nest.costs.fp8_quant.amax_reductions: one fp32 amax over the tp group per sequence-parallel
    FP8 input in forward and output gradient in backward), each an all-reduce of AMAX_BYTES on
    the tp group's lines; term AMAX.<level>, appended to names / fwd / col_of as the variant's
    collectives are. Not overlapped by userbuffers: TE waits on it before the scale kernel
    (quantizer.cpp, `allreduce(...)->wait()`)."""
    pr = problem.training.precision
    if not pr.fp8:
        return []
    counts = amax_reductions(c, pr.fp8_recipe, v.tp, v.sp)
    if not any(counts):
        return []
    one = time("all_reduce", "tp", AMAX_BYTES)
    name = f"{AMAX}.{level_name(problem.cluster, groups['tp'][0])}"
    out = []
    for is_fwd, n in zip((True, False), counts):
        if n and one:
            out.append((column(name, is_fwd, names, fwd, col_of), one * n))
    return out


ROUTING_MAP = "ep_routing_map_all_gather"  # HybridEP's routing-map all-gather (routing_map_terms)


def routing_map_bytes(c, dispatcher: str) -> float:
    """Bytes of the routing map one rank contributes to HybridEP's all-gather in one MoE layer's
    forward: 0 unless `dispatcher` is "hybridep" and the layer has an expert-parallel
    all-to-all; else T x E (one bool byte per token and expert, T the tokens the rank routes:
    the router GEMM's rows, E its columns). Megatron-Core's HybridEPDispatch.forward calls
    HybridEPBuffer.dispatch_with_permute without a handle (megatron/core/transformer/moe/
    fused_a2a.py in megatron-core 0.16 9ed8b0c and 0.18.0rc 4415119), so every forward dispatch
    runs `metadata_preprocessing`, which first gathers the [T, E] torch.bool routing maps of the
    whole EP group (csrc/hybrid_ep/executor/executor.cu `allgather_routing_map`: NCCL's
    all_gather_into_tensor across nodes, a custom NVLink all-gather inside one; DeepEP
    hybrid-ep 34152ae, the commit Megatron-Bridge 21d102f's container builds). The combine
    and the backward reuse the handle: no further gather. The published HybridEP rates
    (nest.network.hybrid_ep) time dispatch with a handle (tests/test_hybrid_ep.py's benchmark
    passes `handle`), so this gather is not in them."""
    if dispatcher != "hybridep" or not any(
            col.kind == "all_to_all" and col.group == "ep" and col.phase == "fwd"
            for col in c.collectives):
        return 0.0
    router = [op for op in c.ops if op.name == "router"]
    if not router:
        return 0.0
    return float(router[0].shape[0] * router[0].shape[1])


def routing_map_terms(problem, c, groups, time, names, fwd, col_of) -> list[tuple[int, float]]:
    """HybridEP's routing-map all-gather of one layer (`routing_map_bytes`): one all-gather of
    ep x those bytes on the ep group's NCCL lines per forward, term ROUTING_MAP.<level>
    (`column`). The custom NVLink gather inside one
    node is priced on the same lines (no published rate of its own)."""
    nbytes = routing_map_bytes(c, problem.training.moe_dispatcher)
    ep = len(groups["ep"][0])
    if not nbytes or ep <= 1:
        return []
    x = time("all_gather", "ep", ep * nbytes)
    if not x:
        return []
    name = f"{ROUTING_MAP}.{level_name(problem.cluster, groups['ep'][0])}"
    return [(column(name, True, names, fwd, col_of), x)]


def ep_lines(problem, groups) -> list:
    """Alpha-beta lines of the expert-parallel all-to-all on a stage's ep groups (one per
    distinct group, as nest.network.collectives.group_lines): the flat all-to-all, or with
    training.moe_dispatcher "hybridep" the level-aware dispatch (nest.network.hybrid_ep)."""
    if problem.training.moe_dispatcher != "hybridep":
        return group_lines(problem.cluster, "all_to_all", groups)
    from nest.network.collectives import distinct
    from nest.network.hybrid_ep import hybrid_all_to_all

    m = problem.model
    return [(hybrid_all_to_all(problem.cluster, g, m.num_experts, m.top_k),)
            for g in distinct(problem.cluster, groups)] if len(groups[0]) > 1 else []


def ep_a2a_bytes(training, col) -> float:
    """A collective's buffer; the expert-parallel all-to-all's grown by the routing imbalance
    (training.moe_routing_imbalance: the busiest rank's received tokens over the mean). The
    all-to-all ends when its busiest rank has received its tokens, so the alpha-beta line is
    priced at that rank's bytes. The layer graph's all-to-all assumes balanced routing (each
    rank receives the b s k h of the mean). Where a run drops tokens at a capacity factor c
    (Megatron-Core --moe-expert-capacity-factor), no expert receives more than c times its
    mean, so c bounds the factor; dropless runs with an auxiliary balancing loss have no
    such bound, and no cited measurement of the factor is in the published table (its MoE
    rows force-balance routing: factor 1). The experts' GEMMs on the busiest rank are not
    scaled (their time stays the balanced one)."""
    if col.kind == "all_to_all" and col.group == "ep":
        return col.bytes * training.moe_routing_imbalance
    return col.bytes


def tp_overlapped(x_LK: np.ndarray, fwd_K: np.ndarray, tp_K: np.ndarray, rs_K: np.ndarray,
                  lt: LayerTable, training, hw) -> np.ndarray:
    """Tensor-parallel communication overlapped with the GEMMs it feeds and follows, as
    Transformer Engine's userbuffers run it (`tp_comm_overlap`; TE `initialize_ub` and
    comm_gemm_overlap.cpp, the NeMo / Megatron-Bridge userbuffers configs: docs/modeling.md,
    "Tensor and sequence parallelism"). Each tp term x_LK of a sequence-parallel layer is scaled
    to what stays exposed, per layer (an exposed total spread over its terms by size):

    - forward reduce-scatters (rs_K) after the row-parallel GEMMs (out-projection, MLP down;
      forward G = lt.proj_fwd_L + lt.down_fwd_L; R the reduce-scatters' time). The GEMM leaves
      m SMs of hw.sm_count to the communication (set_sm_margin; m = training.tp_overlap_attn_sms
      / _mlp_sms) and, compute-bound, runs sm_count / (sm_count - m) longer: G'.
      `pipeline` (TE's default): G' in n = tp_overlap_splits chunks, chunk i's reduce-scatter
      beside chunk i + 1's GEMM, the last alone: (G' - G) + R / n + max(0, R - G') (n - 1) / n.
      `ring_exchange`: tp GEMM chunks, chunk i's send beside chunk i + 1's GEMM, the last chunk
      the device's own; then one kernel sums the tp received chunks (reads the layer's
      reduce-scatter bytes, writes 1 / tp of them, at the streaming bandwidth):
      (G' - G) + max(0, R - G' (tp - 1) / tp) + the sum.
    - the other forward terms (all-gathers before the column-parallel GEMMs, `ring_exchange`:
      the local chunk's GEMM first, each step's transfer beside one chunk's GEMM): exposed
      max(0, A - (F - G) (tp - 1) / tp), F the layer's forward GEMMs.
    - backward (ring-exchange all-gathers before the row-parallel dgrads; `bulk` all-gather and
      reduce-scatter beside the column-parallel dgrad / wgrad GEMMs C, which give up
      tp_overlap_bulk_sms SMs, C' as above): exposed (C' - C) + max(0, B - the backward GEMMs
      - (C' - C))."""
    out = x_LK.copy()
    t = lt.variant.tp
    G_L = lt.proj_fwd_L + lt.down_fwd_L
    G2_L, C2_L = G_L, lt.col_bwd_L
    if hw.sm_count:
        def stretch(m: int) -> float:
            if not 0 <= m < hw.sm_count:
                raise SpecError(f"training settings: tp_overlap_attn_sms / _mlp_sms / _bulk_sms "
                                f"{m}: expected 0 .. {hw.sm_count - 1} (the card's sm_count)")
            return hw.sm_count / (hw.sm_count - m)
        G2_L = (lt.proj_fwd_L * stretch(training.tp_overlap_attn_sms)
                + lt.down_fwd_L * stretch(training.tp_overlap_mlp_sms))
        C2_L = lt.col_bwd_L * stretch(training.tp_overlap_bulk_sms)
    R_K = rs_K & fwd_K & tp_K
    R_L = x_LK[:, R_K].sum(axis=1)
    if training.tp_overlap_rs == "pipeline":
        n = int(training.tp_overlap_splits)
        exp_rs_L = (G2_L - G_L) + R_L / n + np.maximum(R_L - G2_L, 0.0) * (n - 1) / n
    else:
        sum_L = np.array([sum(streaming_s(hw, col.bytes * col.count * (1 + 1 / t)) + col.count
                              * hw.kernel_overhead_s for col in c.collectives
                              if col.group == "tp" and col.phase == "fwd"
                              and col.kind == "reduce_scatter") for c in lt.costs])
        exp_rs_L = (G2_L - G_L) + np.maximum(R_L - G2_L * (t - 1) / t, 0.0) + sum_L
    exp_rs_L = np.where(R_L > 0, exp_rs_L, 0.0)
    A_K = tp_K & fwd_K & ~rs_K
    A_L = x_LK[:, A_K].sum(axis=1)
    exp_ag_L = np.maximum(A_L - (lt.gemm_fwd_L - G_L) * (t - 1) / t, 0.0)
    B_K = tp_K & ~fwd_K
    B_L = x_LK[:, B_K].sum(axis=1)
    dC_L = C2_L - lt.col_bwd_L
    exp_b_L = np.where(B_L > 0, dC_L + np.maximum(B_L - lt.gemm_bwd_L - dC_L, 0.0), 0.0)
    for sel_K, comm_L, exp_L in ((R_K, R_L, exp_rs_L), (A_K, A_L, exp_ag_L), (B_K, B_L, exp_b_L)):
        keep_L = np.where(comm_L > 0, exp_L / np.where(comm_L > 0, comm_L, 1.0), 1.0)
        out[:, sel_K] *= keep_L[:, None]
    return out


def dp_lines(problem, lt: LayerTable, ids, d: int, groups=None):
    """Alpha-beta lines of a stage's data-parallel groups ({"dense" | "expert": {kind: lines}})
    and the level name of its dense group (kept in the problem's cache per (d, `sits_alike` key))."""
    return problem.cache.get(alike_store(lt), ("dp", d, sits_alike(problem.cluster, ids)),
                             lambda: _dp_lines(problem, lt, ids, d, groups))


def _dp_lines(problem, lt: LayerTable, ids, d: int, groups):
    cl, v = problem.cluster, lt.variant
    if groups is None:
        groups = inner_groups(ids, v.tp, v.cp, v.ep, d)
    # each kind's lines as a sorted set (a collective costs its slowest group: lines_time is a
    # max over them), so that the terms are a function of the `priced_alike` key alone
    dp = {part: {k: tuple(sorted(set(x))) for k, x in
                 group_lines_by_kind(cl, SYNC_KINDS, groups["dp_" + part]).items()}
          for part in ("dense", "expert")}
    dg = groups["dp_dense"]
    return read_only(dp), level_name(cl, dg[0]) if dg.shape[1] > 1 else "local"


def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals]: the integral of x n phi(x) Phi(x)^(n-1) on a
    fine grid over [-12, 12] (0 for n = 1; 1 / sqrt(pi) for n = 2)."""
    if n <= 1:
        return 0.0
    from math import erf, sqrt

    x = np.linspace(-12.0, 12.0, 48001)
    phi = np.exp(-x * x / 2) / sqrt(2 * np.pi)
    cdf = 0.5 * (1 + np.vectorize(erf)(x / sqrt(2)))
    return float(np.trapezoid(x * n * phi * cdf ** (n - 1), x))


def forced_balance_imbalance(tokens_per_rank: int, top_k: int, experts: int, ep: int) -> float:
    """The busiest of ep ranks' received routed tokens over the mean when the router draws
    random logits (Megatron-Core `moe_router_force_load_balancing`: the router replaces its
    logits by random normal ones, moe_utils.py apply_random_logits; the Megatron-Bridge MoE
    benchmarks set it), so each token's k experts are a uniform k-subset of E. A token sends X
    copies to one rank's E / ep experts, X hypergeometric (k draws, E / ep of E): mean k / ep,
    variance k (1/ep)(1 - 1/ep)(E - k)/(E - 1).
    Over the ep T tokens of the group a rank receives mean T k, standard deviation
    sd = sqrt(ep T var X), the ranks' counts correlated -1 / (ep - 1) (their sum is fixed). In
    the normal limit they are sd / sqrt(1 - 1/ep) (Z_i - mean Z) for independent standard
    normals Z, so the busiest exceeds the mean by z_ep sd / sqrt(1 - 1/ep), z_ep =
    `expected_max_normal`(ep): the factor 1 + that / (T k)."""
    if ep <= 1:
        return 1.0
    p = 1.0 / ep
    var_x = top_k * p * (1 - p) * (experts - top_k) / (experts - 1)
    sd = np.sqrt(ep * tokens_per_rank * var_x / (1 - p))
    return float(1.0 + expected_max_normal(ep) * sd / (tokens_per_rank * top_k))
