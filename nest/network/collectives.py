"""Device group x cluster levels -> time of a collective or point-to-point transfer (alpha-beta).

Level-wise network abstraction (NEST section 4.2): two devices communicate over the level of their
lowest common switch. A flow that crosses level L is limited by the per-device bandwidth of every
level up to L and, at L, by that level's oversubscription:
    bw(L) = min_{k <= L} bandwidth_k / oversubscription_L.
Collective formulas (alpha-beta model; Thakur, Rabenseifner & Gropp 2005, "Optimization of
Collective Communication Operations in MPICH", section 4; Patarasuk & Yuan 2009 for ring
all-reduce), n devices, buffer S bytes:
    ring all-reduce        2 (n-1)/n * S / bw + 2 (n-1) * alpha
    ring all-gather / RS   (n-1)/n * S / bw + (n-1) * alpha
                           (bw: per device, with one ring per device of a node, see _multi_ring)
    hierarchical (NCCL-style, Jeaugey 2019, "Massively scale your deep learning training with
    NCCL 2.4"): reduce-scatter inside each sub-group of the lower level, the collective across
    sub-groups on S / n_inner, all-gather inside; NCCL picks the faster algorithm, so do we.
    NVLS / NVLS-Tree (all-reduce where the hardware's NVLink switch reduces, NVLink SHARP):
    nest.network.nvls, one more line in the same minimum.
    all-to-all             each device sends S (n-1)/n; the bytes to peers that meet at level >= l
                           share level l's link: max_l bytes(>= l) / bw(l) + (n-1) alpha
    point-to-point         S / bw(l) + alpha_l
Every collective of a given kind on a given group is priced as the fastest of a few algorithms,
each linear in the buffer size: time(S) = min_k (alpha_k + beta_k * S). `coefficients` returns the
(alpha_k, beta_k) lines, so the solver prices whole arrays of buffer sizes with exactly the same
numbers as the evaluator.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from functools import lru_cache

import numpy as np

from nest.network.nvls import nvls_lines
from nest.spec.catalog import ClusterSpec


def path_bandwidth(cluster: ClusterSpec, level: int, line: bool = False) -> float:
    """Per-device bytes/s of a flow whose devices meet at `level`: what NCCL reaches, or with
    `line` the links' nominal rate (for a kernel with its own measured share of it)."""
    bws = [lv.line_bytes_per_s if line else lv.bytes_per_s for lv in cluster.levels[: level + 1]]
    return min(bws) / cluster.levels[level].oversubscription


def span_level(cluster: ClusterSpec, group) -> int:
    """The lowest level whose one switch holds the whole group (-1 for a single device).
    Switch groups are contiguous id ranges, so only the smallest and largest id matter."""
    if len(group) <= 1:
        return -1
    lo, hi = min(group), max(group)
    for i, lv in enumerate(cluster.levels):
        if lo // lv.devices_per_group == hi // lv.devices_per_group:
            return i
    raise AssertionError(f"group spans more than the cluster {cluster.name}")


def span_levels(cluster: ClusterSpec, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """`span_level` of many groups at once from their smallest and largest ids (arrays of the
    same shape): the lowest level one switch of which holds both; len(cluster.levels) where
    none does (span_level raises there)."""
    lvl = np.full(np.shape(lo), len(cluster.levels))
    for i in reversed(range(len(cluster.levels))):
        size = cluster.levels[i].devices_per_group
        lvl = np.where(lo // size == hi // size, i, lvl)
    return lvl


def p2p_time(cluster: ClusterSpec, a: int, b: int, nbytes: float) -> float:
    """One point-to-point transfer of `nbytes` from device a to device b."""
    return float(send_time(cluster, (a,), (b,), nbytes))


def pair_ids(src, dst) -> np.ndarray:
    """Device pairs of a pipeline transfer between two stages, an [n, 2] array of ids: device i
    of the larger stage with device i mod n of the smaller one (rank order; equal sizes: zip)."""
    n = max(len(src), len(dst))
    i = np.arange(n)
    return np.stack([np.asarray(src, dtype=np.int64)[i % len(src)],
                     np.asarray(dst, dtype=np.int64)[i % len(dst)]], axis=1)


def send_time(cluster: ClusterSpec, src, dst, nbytes):
    """Pipeline transfer of `nbytes` (a number or an array) from each device of `src` to its pair
    in `dst`, all at once: the slowest pair, S / bw(l) + alpha_l at the level l it crosses
    (0 where nbytes <= 0 or the pair is one device)."""
    nbytes = np.asarray(nbytes, dtype=float)
    out = np.zeros_like(nbytes)
    for lvl in pair_levels(cluster, tuple(src), tuple(dst)):
        if lvl >= 0:
            out = np.maximum(out, nbytes / path_bandwidth(cluster, lvl)
                             + cluster.levels[lvl].latency_s)
    return np.where(nbytes > 0, out, 0.0)


@lru_cache(maxsize=4096)
def pair_levels(cluster: ClusterSpec, src: tuple, dst: tuple) -> tuple[int, ...]:
    """The distinct network levels the `pair_ids` of a transfer cross (-1: the same device):
    ClusterSpec.level_of of every pair, over arrays."""
    ab = pair_ids(src, dst)
    return pair_levels_rows(cluster, ab[None, :, 0], ab[None, :, 1])[0]


def pair_levels_rows(cluster: ClusterSpec, a: np.ndarray, b: np.ndarray) -> list:
    """`pair_levels` of several transfers at once, pairs (a[k, i], b[k, i]) ([K, n] arrays)."""
    lvl = np.where(a == b, -1, len(cluster.levels))
    for k in reversed(range(len(cluster.levels))):  # the lowest joining level wins
        size = cluster.levels[k].devices_per_group
        lvl = np.where((a != b) & (a // size == b // size), k, lvl)
    if (lvl == len(cluster.levels)).any():
        j = np.argwhere(lvl == len(cluster.levels))[0]
        cluster.level_of(int(a[tuple(j)]), int(b[tuple(j)]))  # raises: the pair shares no level
    lvl = np.sort(lvl, axis=1)
    new = np.ones(lvl.shape, dtype=bool)
    new[:, 1:] = lvl[:, 1:] != lvl[:, :-1]
    return [tuple(row[keep].tolist()) for row, keep in zip(lvl, new)]


def group_lines(cluster: ClusterSpec, kind: str, groups) -> list:
    """Alpha-beta lines of one representative per distinct group shape (`distinct`); [] when the
    groups are single devices."""
    return group_lines_by_kind(cluster, (kind,), groups)[kind]


GROUP_SET_ENTRIES = 32768  # memo of group sets: a 16-byte digest and a few lines each


def group_lines_by_kind(cluster: ClusterSpec, kinds, groups) -> dict:
    """`group_lines` for several kinds of collective on the same groups (one `distinct`),
    memoised per set of distinct hierarchy patterns (`patterns`): two sets with the same
    patterns cost the same, wherever they sit."""
    if len(groups) == 0 or len(groups[0]) <= 1:
        return {k: [] for k in kinds}
    g = np.sort(np.asarray(groups, dtype=np.int64).reshape(len(groups), -1), axis=1)
    first, pats = _distinct_patterns(cluster, g)
    digest = hashlib.blake2b(b"".join(sorted(pats)), digest_size=16).digest()
    key = (cluster, g.shape[1], digest)
    out: dict = {}
    missing = []
    for k in kinds:
        hit = _GROUP_SETS.get((key, k))
        if hit is None:
            missing.append(k)
        else:
            _GROUP_SETS.move_to_end((key, k))
            out[k] = hit
    if missing:
        for k in missing:
            # a tuple: the memo is shared by every problem on this cluster, so nothing in it
            # can be written
            out[k] = _GROUP_SETS[(key, k)] = tuple(coefficients_rows(cluster, k, g[first]))
        while len(_GROUP_SETS) > GROUP_SET_ENTRIES:
            _GROUP_SETS.popitem(last=False)
    return {k: out[k] for k in kinds}


_GROUP_SETS: OrderedDict = OrderedDict()


def lines_time(lines_per_group: list, nbytes):
    """A collective run by all groups at once (lines from `group_lines`): the slowest group, each
    at its fastest algorithm; 0 where nbytes <= 0. Broadcasts over arrays of buffer sizes."""
    if isinstance(nbytes, (int, float)):  # one buffer: the same arithmetic on Python floats
        if nbytes <= 0:
            return 0.0
        return max((min(a + b * nbytes for a, b in lines) for lines in lines_per_group),
                   default=0.0)
    nbytes = np.asarray(nbytes, dtype=float)
    if not lines_per_group:
        return np.zeros_like(nbytes)
    out = np.zeros_like(nbytes)
    for lines in lines_per_group:
        best = lines[0][0] + lines[0][1] * nbytes
        for a, b in lines[1:]:
            best = np.minimum(best, a + b * nbytes)
        out = np.maximum(out, best)
    return np.where(nbytes > 0, out, 0.0)


def worst(cluster: ClusterSpec, kind: str, groups, nbytes: float) -> float:
    """Slowest instance of a collective run by all `groups` at once."""
    return float(lines_time(group_lines(cluster, kind, groups), nbytes))


def _multi_ring(cluster: ClusterSpec, kind: str, g: np.ndarray, top: np.ndarray) -> list:
    """NCCL's ring algorithm with one ring (channel) per device of a node (Jeaugey 2019; NCCL
    builds rings in rail order: channel c leaves every node through its GPU c's NIC). The ring
    visits the devices in id order: inside a node of k group members it makes k - 1 hops on the
    node's links (k if the group is that node), and it leaves the node once, at the level l
    where it meets the next node. The buffer is split over the channels and all hops of all
    channels run at once (pipelined chunks); channel c's exit uses member c's uplink, so per
    device the node's links carry (k - 1) / k and its uplink 1 / k of one ring's hop traffic:
        time = steps * alpha_top + steps / n * S * max over nodes of
               max((k - 1) / k / bw(0), 1 / k / bw(l_exit))
    One device per node (k = 1) is the plain ring at the slowest link; k devices per node give
    S / (k bw) across nodes, the node's k NICs together, which is what NCCL-tests show on
    multi-node DGX systems (test_network); a node with fewer members is the bottleneck.
    Every row of g (sorted ids, [U, n]) at once, top its span level; one line per row."""
    U, n = g.shape
    levels = cluster.levels
    node = levels[0].devices_per_group
    steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
    nxt = np.roll(g, -1, axis=1)  # the ring's next member (sorted ids, wrapping around)
    lvl = np.full((U, n), len(levels) - 1)
    for i in reversed(range(len(levels))):  # the lowest level joining each hop
        size = levels[i].devices_per_group
        lvl = np.where(g // size == nxt // size, i, lvl)
    # node blocks are runs of the sorted ids; a block's ring leaves it from its last member only
    blk = g // node
    last = np.ones((U, n), dtype=bool)
    last[:, :-1] = blk[:, 1:] != blk[:, :-1]
    idx = np.arange(n)
    before = np.maximum.accumulate(np.where(last, idx, -1), axis=1)  # the last end at or before
    members = idx - np.concatenate([np.full((U, 1), -1), before[:, :-1]], axis=1)  # at the ends
    exit_level = np.where(lvl > 0, lvl, -1)
    leaves = exit_level > 0  # a ring inside one node never leaves it: k hops inside
    bw = _bandwidths(cluster)
    inside = (members - leaves) / members / bw[0]
    out = np.where(leaves, np.maximum(inside, 1 / members / bw[exit_level]), inside)
    load = np.where(last, out, -np.inf).max(axis=1)  # the busiest node, per group
    return [(steps * levels[t].latency_s, steps / n * float(x))
            for t, x in zip(top.tolist(), load)]


@lru_cache(maxsize=64)
def _bandwidths(cluster: ClusterSpec) -> np.ndarray:
    """path_bandwidth of every level (read-only)."""
    out = np.array([path_bandwidth(cluster, i) for i in range(len(cluster.levels))])
    out.flags.writeable = False
    return out


def _envelope(lines) -> tuple[tuple[float, float], ...]:
    """Drop lines dominated by another (larger or equal alpha and beta)."""
    lines = sorted(set(lines))
    keep: list[tuple[float, float]] = []
    for a, b in lines:  # ascending alpha: keep a line only if its beta beats all kept ones
        if all(b < kb for _, kb in keep):
            keep.append((a, b))
    return tuple(keep)


def shifted(cluster: ClusterSpec, ids) -> tuple[int, ...]:
    """Device ids moved to the first switch block of their span level, order kept: two sets with
    the same shifted ids sit the same way in the hierarchy, so every group, level and collective
    among them costs the same."""
    a = np.asarray(ids, dtype=np.int64).ravel()
    if a.size == 0:
        return ()
    lvl = span_level(cluster, (int(a.min()), int(a.max())) if a.size > 1 else (0,))
    if lvl < 0:
        return (0,)
    size = cluster.levels[lvl].devices_per_group
    return tuple((a - int(a.min()) // size * size).tolist())


def patterns(cluster: ClusterSpec, groups: np.ndarray) -> np.ndarray:
    """How each group (a row of sorted ids) sits in the hierarchy: for every level and every
    pair of consecutive members, whether they are under different switches of that level
    (packed bits, one row per group). Every cost this module computes for a group is a function
    of its size and this pattern alone: the ring's hop levels, its per-node member counts and
    exits, the span level, the hierarchical sub-groups and the all-to-all's level counts all
    follow from which consecutive members part at which level (switch groups are contiguous
    id ranges, so two members share a level-l switch iff no consecutive pair between them parts
    at l). So groups with equal patterns share one cache entry wherever they are."""
    g = np.asarray(groups, dtype=np.int64)
    parts = np.empty((len(g), len(cluster.levels), max(g.shape[1] - 1, 0)), dtype=bool)
    for i, lv in enumerate(cluster.levels):  # [group, level, consecutive pair]
        q = g // lv.devices_per_group
        np.not_equal(q[:, 1:], q[:, :-1], out=parts[:, i])
    return np.packbits(parts.reshape(len(g), -1), axis=1)


def _distinct_patterns(cluster: ClusterSpec, g: np.ndarray):
    """Row index of the first group of each distinct pattern, and those patterns as bytes."""
    seen: dict[bytes, int] = {}
    for i, row in enumerate(patterns(cluster, g)):
        seen.setdefault(row.tobytes(), i)
    return list(seen.values()), list(seen)


def distinct(cluster: ClusterSpec, groups) -> list[tuple[int, ...]]:
    """One representative per distinct cost shape (`patterns`) among the rows of `groups`
    (2-D ids array), in row order."""
    g = np.sort(np.asarray(groups, dtype=np.int64).reshape(len(groups), -1), axis=1)
    if g.shape[1] <= 1:
        return [tuple(g[0].tolist())]
    first, _ = _distinct_patterns(cluster, g)
    return [tuple(g[i].tolist()) for i in first]


def coefficients(cluster: ClusterSpec, kind: str, group: tuple[int, ...]
                 ) -> tuple[tuple[float, float], ...]:
    """(alpha, beta) lines of the algorithms for `kind` on `group`; () for a single device.
    Cached per (kind, size, `patterns`)."""
    if len(group) <= 1:
        return ()
    return coefficients_rows(cluster, kind, np.sort(np.asarray(group, dtype=np.int64))[None])[0]


def coefficients_rows(cluster: ClusterSpec, kind: str, rows: np.ndarray, pats=None) -> list:
    """`coefficients` of every row of `rows` (sorted ids, [U, n], n >= 2; pats: their
    `patterns` if known), the rows not yet cached priced together (`_coefficients`)."""
    rows = np.asarray(rows, dtype=np.int64)
    n = rows.shape[1]
    pats = patterns(cluster, rows) if pats is None else pats
    memo = _LINES.get(cluster)
    if memo is None:
        memo = _LINES[cluster] = {}
        while len(_LINES) > LINES_CLUSTERS:
            _LINES.pop(next(iter(_LINES)))
    keys = [(kind, n, row.tobytes()) for row in pats]
    todo: dict = {}
    for i, key in enumerate(keys):
        if key not in memo:
            todo.setdefault(key, i)
    if todo:
        # tuples: the memo is shared by every problem on this cluster, so nothing in it can be
        # written
        memo.update(zip(todo, _coefficients(cluster, kind, rows[list(todo.values())])))
        while len(memo) > LINES_ENTRIES:
            memo.pop(next(iter(memo)))
        if any(key not in memo for key in keys):  # evicted at once: a batch larger than the memo
            return [memo[k] if k in memo else _coefficients(cluster, kind, rows[i:i + 1])[0]
                    for i, k in enumerate(keys)]
    return [memo[key] for key in keys]


LINES_ENTRIES = 65536  # distinct patterns kept per cluster (BERT on 1024 spine-leaf GPUs: ~22,000)
LINES_CLUSTERS = 16  # clusters whose patterns are kept (a cluster and its flattened view: two)
_LINES: dict = {}


def collective_time(cluster: ClusterSpec, kind: str, group: tuple[int, ...], nbytes: float) -> float:
    """Time of one collective of `kind` over the devices `group` with an S-byte buffer."""
    if len(group) <= 1:
        return 0.0
    return float(lines_time([coefficients(cluster, kind, group)], nbytes))


def _coefficients(cluster: ClusterSpec, kind: str, g: np.ndarray) -> list:
    """The lines of every row of g (sorted ids, [U, n], n >= 2): the flat ring, a torus block's
    rings, NVLS, and the hierarchical algorithm over the sub-groups of the level below the
    span, whose parts (the sub-groups' and the leaders' collectives) are priced in one batch
    per sub-group size (`coefficients_rows`)."""
    U, n = g.shape
    # span levels: the lowest holding first and last (the top level where none does)
    top = np.minimum(span_levels(cluster, g[:, 0], g[:, -1]), len(cluster.levels) - 1)
    if kind == "all_to_all":
        return [(_all_to_all(cluster, tuple(row)),) for row in g.tolist()]
    flat = _multi_ring(cluster, kind, g, top)
    block = {t: _block_rings(cluster, kind, g[0], t) for t in set(top.tolist())}  # n and t only
    out = []
    for i, t in enumerate(top.tolist()):
        rings = [flat[i]] if block[t] is None else [flat[i], block[t]]
        if kind == "all_reduce":  # NVLS reduces only (nest.network.nvls)
            rings += nvls_lines(cluster, kind, g[i], t, path_bandwidth(cluster, t))
        out.append(rings)
    # hierarchical: sub-groups under the switches of the level below, runs of the sorted ids;
    # uneven sub-groups (NCCL falls back to a flat ring) or single-device ones: none
    n_in = np.zeros(U, dtype=np.int64)
    for t in set(top.tolist()) - {0}:
        sub = g // cluster.levels[t - 1].devices_per_group
        starts = np.ones((U, n), dtype=bool)
        starts[:, 1:] = sub[:, 1:] != sub[:, :-1]
        count = starts.sum(axis=1)
        size = n // count
        even = (n % count == 0) & (starts == (np.arange(n) % size[:, None] == 0)).all(axis=1)
        n_in = np.where((top == t) & even & (size > 1), size, n_in)
    parts_of = {"all_reduce": (("reduce_scatter", 1), ("all_reduce", 0), ("all_gather", 1))}
    for k in set(n_in.tolist()) - {0}:
        sel = np.flatnonzero(n_in == k)
        inner, outer = g[sel, :k], g[sel, ::k]  # the first sub-group, the sub-groups' leaders
        parts = [(coefficients_rows(cluster, part, inner if is_inner else outer),
                  1.0 if is_inner else 1.0 / k)
                 for part, is_inner in parts_of.get(kind, ((kind, 1), (kind, 0)))]
        for j, i in enumerate(sel.tolist()):
            hier = [(0.0, 0.0)]
            for lines, scale in parts:  # sum of independent mins = min over combinations of sums
                hier = [(a0 + a, b0 + b * scale) for a0, b0 in hier for a, b in lines[j]]
            out[i] = out[i] + hier
    return [_envelope(r) if len(r) > 1 else (r[0],) for r in out]


def _block_rings(cluster: ClusterSpec, kind: str, group: tuple[int, ...], top: int):
    """A ring collective over one whole group of level `top` whose level gives a ring bandwidth
    (a torus block: bidirectional rings along every dimension, each device driving all its
    links in the block; nest.network.topology.torus_levels): the ring formula at that
    bandwidth, steps x the level's latency (a bound: dimension-ordered rings take fewer
    steps). None when the level has none or the group is not the whole block. A function of
    the group's size and `patterns` (a sorted group inside one block is that block iff its
    size is the block's), so the per-pattern caches stay exact."""
    lv = cluster.levels[top]
    if lv.ring_bytes_per_s <= 0 or len(group) != lv.devices_per_group:
        return None
    n = len(group)
    steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
    return steps * lv.latency_s, steps / n / lv.ring_bytes_per_s


def _all_to_all(cluster: ClusterSpec, group: tuple[int, ...]) -> tuple[float, float]:
    """Bytes to peers that meet at level >= l all pass level l's per-device link, in parallel with
    the traffic of lower levels: time = max_l bytes(>= l) / bw(l) + (n-1) alpha."""
    n = len(group)
    top = span_level(cluster, group)
    worst = 0.0
    for a in (group[0], group[-1]):  # end devices bound the symmetric cases
        lvls = np.array([cluster.level_of(a, b) for b in group if b != a])
        worst = max(worst, max(np.count_nonzero(lvls >= lv) / (n * path_bandwidth(cluster, lv))
                               for lv in range(top + 1)))
    return (n - 1) * cluster.levels[top].latency_s, float(worst)


def flattened(cluster: ClusterSpec, bytes_per_s: float | None = None) -> ClusterSpec:
    """The network-blind view of a cluster (Phaze-style: one flat bandwidth, no hierarchy): every
    level gets the same per-device bandwidth (default: the innermost level's), the innermost
    latency, no oversubscription and no faster ring bandwidth of its own (a torus block's, an
    NVLink domain's NVLS, nest.network.nvls); the
    cluster's comm_scale kept and applied to bytes_per_s."""
    from dataclasses import replace

    # an explicit bandwidth is as described: the cluster's comm_scale applies to it too
    bw = bytes_per_s / cluster.comm_scale if bytes_per_s else cluster.levels[0].bytes_per_s
    lat = cluster.levels[0].latency_s
    eff = cluster.levels[0].efficiency  # the innermost level's line rate too
    levels = tuple(replace(lv, bytes_per_s=bw, latency_s=lat, oversubscription=1.0,
                           ring_bytes_per_s=0.0, nvls_bytes_per_s=0.0, efficiency=eff)
                   for lv in cluster.levels)
    return replace(cluster, name=f"{cluster.name}_flat", levels=levels)
