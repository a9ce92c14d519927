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
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from nest.costs.alike import (SYNC_KINDS, inner_groups, level_name, priced_alike,
                              priced_alike_keys, sits_alike)
from nest.costs.cache import read_only
from nest.costs.layers import LayerTable, prefix
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
    for (tp, cp, ep), same in by_shape.items():
        groups = inner_groups(np.asarray(ids), tp, cp, ep, d)
        keys.update(zip(map(id, same), priced_alike_keys(problem, same, groups)))
    for lt in lts:
        out.append([problem.cache.get(lt.store, ("group", d, key),
                                      lambda i=i, lt=lt: _group_terms(problem, lt, i, d))
                    for key, i in zip(keys[id(lt)], ids)])
    return out


def alike_store(lt: LayerTable) -> tuple:
    """The cache store of the entries kept per `sits_alike` key (many, cheap to remake), apart
    from lt.store's grids so that they do not evict them."""
    return (*lt.store, "alike")


def _priced_alike_terms(problem, lt: LayerTable, ids, d: int) -> GroupTerms:
    v = lt.variant
    key = priced_alike(problem, lt, inner_groups(ids, v.tp, v.cp, v.ep, d))
    return problem.cache.get(lt.store, ("group", d, key),
                             lambda: _group_terms(problem, lt, ids, d))


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
    if problem.training.tp_comm_overlap and v.sp and v.tp > 1:
        x_LK = tp_overlapped(x_LK, fwd_K, np.array([n.startswith("tp_") for n in names]), lt)
    full_R = np.array([r == "full" for r in lt.modes])
    total_L = x_LK.sum(axis=1)
    fwd_L = x_LK[:, fwd_K].sum(axis=1) if K else np.zeros(L)
    tot_LR = total_L[:, None] + np.where(full_R, fwd_L[:, None], 0.0)
    dp, dp_level = dp_lines(problem, lt, ids, d, groups)
    return GroupTerms(tuple(names), read_only(fwd_K), read_only(prefix(x_LK)),
                      read_only(prefix(tot_LR)), dp, dp_level, read_only(tot_LR), read_only(fwd_L))


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


def tp_overlapped(x_LK: np.ndarray, fwd_K: np.ndarray, tp_K: np.ndarray, lt: LayerTable):
    """Tensor-parallel communication overlapped with the GEMMs it feeds and follows (Transformer
    Engine's userbuffers, `tp_comm_overlap`; Wang et al. 2023, "Overlap communication with
    dependent computation via decomposition"): the all-gathers and reduce-scatters of the
    sequence-parallel linears run in chunks under their GEMMs, so per layer and phase only what
    exceeds the layer's GEMM time stays exposed: each tp term of the phase is scaled by
    max(0, tp - gemm) / tp. (The chunks' pipeline fill is not charged.)"""
    out = x_LK.copy()
    for phase_K, gemm_L in ((tp_K & fwd_K, lt.gemm_fwd_L), (tp_K & ~fwd_K, lt.gemm_bwd_L)):
        comm_L = x_LK[:, phase_K].sum(axis=1)
        keep_L = np.where(comm_L > 0, np.maximum(comm_L - gemm_L, 0.0) / np.where(
            comm_L > 0, comm_L, 1.0), 1.0)
        out[:, phase_K] *= keep_L[:, None]
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
