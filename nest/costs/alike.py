"""A stage's device ids -> its groups, and keys of how they sit and how they price.

Part of the stage kernel (nest.costs.groups keeps a stage's group terms per key in the
problem's nest.costs.cache.ProblemCache): `inner_groups` splits a stage into its tp / cp / ep
and data-parallel groups; `sits_alike` keys how the stage sits in the hierarchy (cheap, fine);
`priced_alike` keys what its group terms read of those groups (coarser: stages that sit
differently but whose groups price the same share one entry); `priced_alike_keys` computes the
latter for every stage position of a placement at once (the joint bound's many positions).
"""

from __future__ import annotations

import hashlib
import pickle

import numpy as np

from nest.costs.fp8_quant import amax_reductions
from nest.network.collectives import coefficients_rows, patterns, span_level, span_levels

SYNC_KINDS = ("all_reduce", "reduce_scatter", "all_gather")


def inner_groups(ids, tp: int, cp: int, ep: int, dp: int) -> dict[str, np.ndarray]:
    """tp / cp / ep groups of every replica, and the data-parallel groups of the stage, as 2-D
    arrays (one group per row). Replica r holds ids[r*w:(r+1)*w], inner rank = (e*cp + c)*tp + t:
    dense weights are replicated over the dp, ep and cp ranks; experts over dp and cp ranks.
    ids may carry leading axes (several stages: [P, D]); the groups then carry them too."""
    ids = np.asarray(ids)
    lead = ids.shape[:-1]
    n = len(lead)
    a = ids.reshape(*lead, dp, ep, cp, tp)
    k = tuple(range(n))

    def perm(*axes):
        return a.transpose(*k, *(n + x for x in axes))

    return {
        "tp": a.reshape(*lead, -1, tp),
        "cp": perm(0, 1, 3, 2).reshape(*lead, -1, cp),
        "ep": perm(0, 2, 3, 1).reshape(*lead, -1, ep),
        "dp_dense": perm(3, 0, 1, 2).reshape(*lead, tp, -1),
        "dp_expert": perm(3, 1, 0, 2).reshape(*lead, tp * ep, -1),
    }


def sits_alike(cluster, ids) -> tuple:
    """A key of how an ordered device set sits in the hierarchy, wherever it is: its size, the
    rank order of its ids and, for every level, which consecutive ids (sorted) are under
    different switches (nest.network.collectives.patterns). Two sets with the same key give
    every sub-group taken by list position (`inner_groups`) the same size and pattern (switch
    groups are contiguous id ranges, so two members share a level-l switch iff no consecutive
    pair between them parts at l) and the same span level, hence the same collectives, lines
    and level names: the group terms and the stage terms are functions of the key and d.
    Unlike shifting ids to their span level's first block, it matches stages across a
    boundary that does not line up with the stage size (1,024 GPUs over 72-GPU domains)."""
    a = np.asarray(ids, dtype=np.int64).ravel()
    if a.size <= 1:
        return (a.size,)
    order = np.argsort(a, kind="stable")
    pat = patterns(cluster, a[order][None, :])
    return (a.size, hashlib.blake2b(order.tobytes() + pat.tobytes(), digest_size=16).digest())


def level_name(cluster, group) -> str:
    """The name of the lowest level one switch of which holds the group ("local": one device);
    span_level reads only its smallest and largest id."""
    g = np.asarray(group).ravel()
    lvl = span_level(cluster, (int(g.min()), int(g.max()))) if g.size > 1 else -1
    return cluster.levels[lvl].name if lvl >= 0 else "local"


def priced_alike(problem, lt, groups: dict) -> bytes:
    """A key of what a stage's group terms read of its groups (`inner_groups`): per group name
    the variant's collectives use (and both data-parallel ones), the level name of its first
    group and, per collective kind run on it, the set of its groups' alpha-beta lines
    (nest.network.collectives.coefficients of one group per distinct `patterns` row). A
    collective costs its slowest group (lines_time: a max over the groups, each at its fastest
    line), so two stages with the same key get the same times, names and data-parallel lines:
    the same group terms. Coarser than `sits_alike`: groups that sit differently but price the
    same (a ring that leaves its rack at a different member) share a key."""
    batch = {k: np.asarray(g)[None] for k, g in groups.items()}
    return priced_alike_keys(problem, [lt], batch)[0][0]


def priced_alike_keys(problem, lts, groups: dict) -> list[list[bytes]]:
    """`priced_alike` of P stages at once for each layer table of `lts` (variants with the
    same groups), groups as `inner_groups` of the stages' [P, D] ids: every group's `patterns`
    row computed in one pass, the lines priced once per distinct row; [per table][per stage]."""
    cluster = problem.cluster
    P = len(next(iter(groups.values())))
    by_lt = [problem.cache.get(lt.store, ("kinds_by_group",),
                               lambda lt=lt: _kinds_by_group(lt, problem.training.precision,
                                                             problem.training.moe_dispatcher))
             for lt in lts]
    rows = {}  # per group name: (sorted groups, pattern rows, first of each, index, levels)
    for name in sorted({n for by in by_lt for n, _ in by}):
        g = np.sort(np.asarray(groups[name], dtype=np.int64), axis=-1)
        _, R, S = g.shape
        if S <= 1:
            continue
        flat = g.reshape(P * R, S)
        pats = patterns(cluster, flat)
        _, first, inv = np.unique(pats.view(np.dtype((np.void, pats.shape[1]))).ravel(),
                                  return_index=True, return_inverse=True)
        inv = inv.reshape(P, R)
        # a sorted group's span level is a function of its pattern row (its first group's)
        us = sorted(set(inv[:, 0].tolist()))
        level = dict(zip(us, _level_names(cluster, flat[first[us]])))
        rows[name] = (flat, pats, first, [sorted(set(r)) for r in inv.tolist()],
                      [level[u] for u in inv[:, 0].tolist()])
    out, interned = [], {}
    for by in by_lt:
        keys: list[list] = [[] for _ in range(P)]
        for name, kinds in by:
            if name not in rows:
                for key in keys:
                    key.append((name,))
                continue
            flat, pats, first, distinct, level = rows[name]
            lines = [coefficients_rows(cluster, k, flat[first], pats[first]) for k in kinds]
            if name == "ep" and problem.training.moe_dispatcher == "hybridep":
                lines.append([_hybrid_lines(problem, flat[i]) for i in first])
            for key, us, lv in zip(keys, distinct, level):
                key.append((name, lv, tuple(tuple(sorted({ln[u] for u in us})) for ln in lines)))
        # as bytes: a cache key hashed once (tuples rehash their whole nest on every lookup);
        # the pickle of equal tuples of str, int and float is equal, and only of equal ones;
        # equal keys held once (the placements' keys are kept: nest.costs.cache.STORE_ENTRIES)
        out.append([interned.setdefault(b, b)
                    for b in (pickle.dumps(tuple(k), protocol=5) for k in keys)])
    return out


def _level_names(cluster, sorted_rows: np.ndarray) -> list[str]:
    """`level_name` of every row of sorted ids ([U, S], S >= 2) at once: the lowest level whose
    one switch holds the row's smallest and largest id (its first and last), as span_level."""
    lvl = span_levels(cluster, sorted_rows[:, 0], sorted_rows[:, -1])
    if (lvl == len(cluster.levels)).any():
        raise AssertionError(f"group spans more than the cluster {cluster.name}")
    return [cluster.levels[i].name for i in lvl.tolist()]


def _hybrid_lines(problem, group: np.ndarray) -> tuple:
    """The level-aware ep dispatch's line of a sorted group (nest.network.hybrid_ep; its own
    memo), a function of its `patterns` row and the model's experts and top-k."""
    from nest.network.hybrid_ep import hybrid_all_to_all

    m = problem.model
    return (hybrid_all_to_all(problem.cluster, tuple(group.tolist()), m.num_experts, m.top_k),)


def _kinds_by_group(lt, precision=None, dispatcher: str = "alltoall") -> tuple:
    """((group name, (collective kinds run on it, sorted)), ...) of the variant's collectives,
    the FP8 amax all-reduces on tp (nest.costs.fp8_quant.amax_reductions, under `precision`),
    HybridEP's routing-map all-gather on ep (nest.costs.groups.routing_map_bytes, under the
    `dispatcher` "hybridep") and the data-parallel sync (`SYNC_KINDS` on dp_dense and
    dp_expert), sorted by name."""
    kinds: dict[str, set] = {"dp_dense": set(SYNC_KINDS), "dp_expert": set(SYNC_KINDS)}
    v = lt.variant
    for c in {id(c): c for c in lt.costs}.values():
        for col in c.collectives:
            kinds.setdefault(col.group, set()).add(col.kind)
        if (precision is not None and precision.fp8
                and any(amax_reductions(c, precision.fp8_recipe, v.tp, v.sp))):
            kinds.setdefault("tp", set()).add("all_reduce")
        if dispatcher == "hybridep" and any(col.kind == "all_to_all" and col.group == "ep"
                                            for col in c.collectives):
            kinds.setdefault("ep", set()).add("all_gather")
    return tuple((n, tuple(sorted(k))) for n, k in sorted(kinds.items()))
