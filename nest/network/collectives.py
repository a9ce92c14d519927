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
    hierarchical (NCCL-style, Jeaugey 2019, "Massively scale your deep learning training with
    NCCL 2.4"): reduce-scatter inside each sub-group of the lower level, the collective across
    sub-groups on S / n_inner, all-gather inside; NCCL picks the faster algorithm, so do we.
    all-to-all             each device sends S (n-1)/n; the bytes to peers that meet at level >= l
                           share level l's link: max_l bytes(>= l) / bw(l) + (n-1) alpha
    point-to-point         S / bw(l) + alpha_l
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from nest.specs import ClusterSpec


def path_bandwidth(cluster: ClusterSpec, level: int) -> float:
    """Per-device bytes/s of a flow whose devices meet at `level`."""
    bws = [lv.bytes_per_s for lv in cluster.levels[: level + 1]]
    return min(bws) / cluster.levels[level].oversubscription


def span_level(cluster: ClusterSpec, group: tuple[int, ...]) -> int:
    """The lowest level whose one switch holds the whole group (-1 for a single device)."""
    if len(group) <= 1:
        return -1
    ids = np.asarray(group)
    for i, lv in enumerate(cluster.levels):
        if np.all(ids // lv.devices_per_group == ids[0] // lv.devices_per_group):
            return i
    raise AssertionError(f"group spans more than the cluster {cluster.name}")


def p2p_time(cluster: ClusterSpec, a: int, b: int, nbytes: float) -> float:
    lvl = cluster.level_of(a, b)
    if lvl < 0 or nbytes <= 0:
        return 0.0
    return nbytes / path_bandwidth(cluster, lvl) + cluster.levels[lvl].latency_s


def _ring(kind: str, n: int, nbytes: float, bw: float, alpha: float) -> float:
    steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
    return steps / n * nbytes / bw + steps * alpha


def collective_time(cluster: ClusterSpec, kind: str, group: tuple[int, ...], nbytes: float) -> float:
    """Time of one collective of `kind` over the devices `group` with an S-byte buffer."""
    return _collective(cluster, kind, tuple(sorted(group)), float(nbytes))


@lru_cache(maxsize=65536)
def _collective(cluster: ClusterSpec, kind: str, group: tuple[int, ...], nbytes: float) -> float:
    n = len(group)
    if n <= 1 or nbytes <= 0:
        return 0.0
    top = span_level(cluster, group)
    lv = cluster.levels[top]
    bw, alpha = path_bandwidth(cluster, top), lv.latency_s
    if kind == "all_to_all":
        return _all_to_all(cluster, group, nbytes)
    flat = _ring(kind, n, nbytes, bw, alpha)
    if top == 0:
        return flat
    # hierarchical: sub-groups under the switches of the level below
    below = cluster.levels[top - 1].devices_per_group
    subs: dict[int, list[int]] = {}
    for d in group:
        subs.setdefault(d // below, []).append(d)
    sizes = {len(v) for v in subs.values()}
    if len(sizes) != 1:
        return flat  # uneven sub-groups: NCCL falls back to a flat ring
    n_in = sizes.pop()
    if n_in == 1:
        return flat
    inner = tuple(next(iter(subs.values())))
    outer = tuple(v[0] for v in subs.values())
    if kind == "all_reduce":
        hier = (_collective(cluster, "reduce_scatter", inner, nbytes)
                + _collective(cluster, "all_reduce", outer, nbytes / n_in)
                + _collective(cluster, "all_gather", inner, nbytes))
    else:  # all_gather / reduce_scatter: outer step on the 1/n_in shard of the buffer
        hier = (_collective(cluster, kind, inner, nbytes)
                + _collective(cluster, kind, outer, nbytes / n_in))
    return min(flat, hier)


def _all_to_all(cluster: ClusterSpec, group: tuple[int, ...], nbytes: float) -> float:
    """Bytes to peers that meet at level >= l all pass level l's per-device link, in parallel with
    the traffic of lower levels: time = max_l bytes(>= l) / bw(l) + (n-1) alpha."""
    n = len(group)
    per_peer = nbytes / n
    top = span_level(cluster, group)
    worst = 0.0
    for a in (group[0], group[-1]):  # end devices bound the symmetric cases
        lvls = np.array([cluster.level_of(a, b) for b in group if b != a])
        t = max(per_peer * np.count_nonzero(lvls >= lv) / path_bandwidth(cluster, lv)
                for lv in range(top + 1))
        worst = max(worst, t)
    return float(worst) + (n - 1) * cluster.levels[top].latency_s
